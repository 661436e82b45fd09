"""compact GPU ownership events: container and transaction IDs as bytes on SQLite

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

From now on, on SQLite, a GPU ownership event (four a transaction: a release and a claim
per role) stores its `container_id` (64 hex digits) as its 32 bytes
(`coltypes.HexDigest`) and its `tx_id` as the UUID's 16 bytes (`coltypes.CompactUuid`),
read back as the text its row digest covers; a value that would not read back the same,
and every row written before, stays text. No view reads the table (`v_gpu_owners` reads
the projection, which stores text); the projection rebuild decodes them, and a
transaction's events are found in either form. No column is added; PostgreSQL stores text.

anvilctl before 0014 cannot read those rows, so this revision makes it refuse the
database ("written by a newer version") instead. A downgrade changes nothing: rows
written compactly stay, and anvilctl before 0014 cannot read them.
"""

from __future__ import annotations

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
