"""lean records: compact journal values, snapshot deltas, derived diffs; one index dropped

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

Rows written from now on are stored more compactly; no column is added, each value's
form tells which it is, and every row written before reads and verifies as it did:

- journal entries list each covered row by the first 16 bytes of its SHA-256
  (`audit.ROW_DIGEST_BYTES`; packed under tag `00 73` on SQLite), leave out of a `batch`
  the events their own rows name, and on SQLite store `at` as 8 bytes and `tx_id` as
  16 (`coltypes.CompactTime`, `CompactUuid`);
- a new snapshot body may be stored as a delta against an earlier whole one
  (`blobdelta`), and a diff that is exactly the diff of its two stored snapshots as
  `"blobs"` (`snapshots.DERIVED`);
- the promotion record names its VRAM reading instead of copying it.

anvilctl before 0011 cannot read those rows (it would report the 16-byte digests as
edited rows), so this revision exists to make it refuse the database ("written by a
newer version") instead. `ix_snapshots_sha256` is dropped: a snapshot's body is found
by its SHA-256 in `snapshot_blobs` (primary key); only a row written before 0007, which
holds its body itself, was ever found through it (now by a scan, for such old rows).

A downgrade restores the index; rows written in the new forms stay (history is not
rewritten), and anvilctl before 0011 cannot verify or read them.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_snapshots_sha256", table_name="snapshots")


def downgrade() -> None:
    op.create_index("ix_snapshots_sha256", "snapshots", ["sha256"], unique=False)
