"""shm ledger: shared-memory files seen held by managed containers, and a view over them

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import drop_append_only, make_append_only
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES_0004

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shm_marks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("dev", sa.BigInteger(), nullable=False),
        sa.Column("ino", sa.BigInteger(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("shm_marks", schema=None) as batch_op:
        batch_op.create_index("ix_shm_marks_boot_id_path", ["boot_id", "path"], unique=False)
    for table in APPEND_ONLY_TABLES_0004:
        make_append_only(table)
    op.execute(
        """
        CREATE VIEW v_shm_marks AS
        SELECT id, boot_id, path, dev, ino, container_id, at AS seen_at FROM shm_marks
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_shm_marks")
    for table in APPEND_ONLY_TABLES_0004:
        drop_append_only(table)
    with op.batch_alter_table("shm_marks", schema=None) as batch_op:
        batch_op.drop_index("ix_shm_marks_boot_id_path")
    op.drop_table("shm_marks")
