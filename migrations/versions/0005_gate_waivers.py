"""gate waivers: a waiver can name the functional gates whose failure it waives

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-30

The `gate` policy (anvil_ctl.core.waivers.GATE) scopes a waiver to one recipe digest and
names gates; they are stored as a JSON list. Older rows get `[]`. v_waivers gains the
column (operator views only ever grow).

Merge note: revision 0004 (shm marks) exists on another branch; when both are merged,
this revision revises 0004 instead (one line, `down_revision`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None

_V_WAIVERS = """
    CREATE VIEW v_waivers AS
    SELECT w.id AS waiver_id, w.policy, w.roles_json, w.recipe_digest, w.value,
           w.approved_by, w.reason, w.created_at, w.expires_at,
           r.at AS revoked_at, r.by AS revoked_by{extra}
    FROM waivers w LEFT JOIN waiver_revocations r ON r.waiver_id = w.id
"""


def upgrade() -> None:
    op.add_column("waivers", sa.Column("gates_json", sa.Text(), nullable=False, server_default="[]"))
    op.execute("DROP VIEW IF EXISTS v_waivers")
    op.execute(_V_WAIVERS.format(extra=", w.gates_json"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_waivers")
    op.execute(_V_WAIVERS.format(extra=""))
    with op.batch_alter_table("waivers") as batch_op:
        batch_op.drop_column("gates_json")
