"""gate waivers: a waiver can name the functional gates whose failure it waives

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30

The `gate` policy (anvil_ctl.core.waiver.GATE) scopes a waiver to one recipe digest and
names gates; they are stored as a JSON list in `waivers.gates_json`. v_waivers gains the
column (operator views only ever grow).

The column is nullable and stays NULL for a waiver that names no gates (every waiver
written before this revision, and every vram-reserve waiver): `waivers` is a history
table covered by the audit chain (migration 0005), and a row's digest leaves NULL
columns out, so the rows already covered keep the digest their audit entries recorded.
A `[]` default would have changed the digest of every existing waiver and made
`audit verify` report them all as edited. No new table, so nothing new to cover.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
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
    op.add_column("waivers", sa.Column("gates_json", sa.Text(), nullable=True))
    op.execute("DROP VIEW IF EXISTS v_waivers")
    op.execute(_V_WAIVERS.format(extra=", w.gates_json"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_waivers")
    op.execute(_V_WAIVERS.format(extra=""))
    # A plain DROP COLUMN (SQLite >= 3.35, PostgreSQL): a batch copy of the table would drop
    # its append-only and no-replace triggers.
    op.drop_column("waivers", "gates_json")
