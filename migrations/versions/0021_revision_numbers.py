"""a slot's revisions numbered in the projection; decisions found by indexes

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

`audit history` and `rollback --to N` number a slot's revisions (its adopts, loads, promotes
and rollbacks that ran), from 1 in the order they began. They counted them each time: one
pass over every transaction of the slot with two subqueries each (0.6 s of SQL at 100k
transactions, before `rollback --to` checked its first guard). From now on a transaction's
number is kept in `tx_current.revision`, given in the database transaction that records its
`running` (the host's lock makes a slot's transactions begin and run one at a time, so that
order is the order they began), and `ix_tx_current_revision` finds a slot's newest, one by
number, and how many, by a search. This revision numbers every revision recorded before it as
they were numbered (by each one's first state row); `projection.rebuild` derives the same
numbers from history, so `audit verify` holds the two equal. About 20 bytes per revision.

Decisions are found without reading them all: `audit decisions` lists the newest (`--limit`)
through `ix_decisions_at`, and what reclassifies a decision (read by every qualify, by promote's
acceptance step through the decision it relies on, by `gpu waive` and by `report`, each of
which read every decision recorded) through `ix_decisions_reclassifies`, which holds
reclassifications only.

anvilctl before 0021 would record revisions without their numbers (this revision makes it
refuse the database). A downgrade drops both indexes and the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

REVISION_INDEX = "ix_tx_current_revision"
DECISIONS_INDEX = "ix_decisions_at"
RECLASSIFIES_INDEX = "ix_decisions_reclassifies"

# the numbers as `queries` counted them before this revision (a migration does not import the
# code it migrates for): a slot's revision-kind transactions that ran, by first state row
NUMBERED = """
    SELECT n.tx_id, ROW_NUMBER() OVER (PARTITION BY n.host_id, n.slot ORDER BY n.first_state) AS revision
    FROM (
        SELECT c.tx_id, c.host_id, c.slot,
               (SELECT min(s.id) FROM transaction_states s WHERE s.tx_id = c.tx_id) AS first_state
        FROM tx_current c
        WHERE c.kind IN ('adopt', 'load', 'promote', 'rollback') AND c.slot IS NOT NULL
          AND EXISTS (SELECT 1 FROM transaction_states r WHERE r.tx_id = c.tx_id AND r.state = 'running')
    ) n
"""


def upgrade() -> None:
    op.add_column("tx_current", sa.Column("revision", sa.Integer(), nullable=True))
    op.execute(
        f"UPDATE tx_current SET revision = numbered.revision FROM ({NUMBERED}) numbered "  # noqa: S608
        "WHERE numbered.tx_id = tx_current.tx_id"
    )
    op.create_index(
        REVISION_INDEX,
        "tx_current",
        ["host_id", "slot", "revision"],
        sqlite_where=sa.text("revision IS NOT NULL"),
        postgresql_where=sa.text("revision IS NOT NULL"),
    )
    op.create_index(DECISIONS_INDEX, "decisions", ["at"])
    op.create_index(
        RECLASSIFIES_INDEX,
        "decisions",
        ["reclassifies"],
        sqlite_where=sa.text("reclassifies IS NOT NULL"),
        postgresql_where=sa.text("reclassifies IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(RECLASSIFIES_INDEX, table_name="decisions")
    op.drop_index(DECISIONS_INDEX, table_name="decisions")
    op.drop_index(REVISION_INDEX, table_name="tx_current")
    # SQLite 3.35 and later drop a column no index names in place (a batch copy would make
    # the table's other indexes again from their reflection)
    op.execute("ALTER TABLE tx_current DROP COLUMN revision")
