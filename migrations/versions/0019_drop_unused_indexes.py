"""drop three indexes no query uses: transactions.kind, transactions.slot, decisions.identity_digest

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03

Every read of a transaction's kind or slot goes through `tx_current` (the projection, since
0007: `v_transactions`, the guards, `status`) and has its own indexes there; the one query of
the history table by slot (`snapshots.served_snapshot`) walks the snapshots newest first and
keeps off the slot index on purpose. `ix_decisions_identity_digest` is a prefix of
`ix_decisions_identity_digest_at` (0007), which serves every lookup by digest. Each cost
every transaction (or decision) a row in a B-tree: together about 70 bytes per transaction.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

DROPPED = (
    ("ix_transactions_kind", "transactions", ["kind"]),
    ("ix_transactions_slot", "transactions", ["slot"]),
    ("ix_decisions_identity_digest", "decisions", ["identity_digest"]),
)


def upgrade() -> None:
    for name, table, _ in DROPPED:
        op.drop_index(name, table_name=table)


def downgrade() -> None:
    for name, table, columns in DROPPED:
        op.create_index(name, table, columns)
