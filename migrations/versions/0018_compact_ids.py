"""compact IDs: link tags, boot IDs and snapshot references as bytes on SQLite

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

From now on, on SQLite, these values are stored as their bytes and read back as the text
a row's digest (or an entry's hash) covers; a value that would not read back the same, and
every row written before, stays text:

- a journal entry's `prev_hash`, the previous hash's first 8 hex digits (`audit.LINK_TAG`),
  as 4 bytes (`coltypes.LinkTag`; the whole hash of an entry from before 0010 stays text);
- a transaction's `owner_boot_id` and a lock's `boot_id` (UUIDs) as 16 (`CompactUuid`);
- a snapshot row's `sha256` and a diff's `before_sha256` and `after_sha256` as 32
  (`HexDigest`); the blobs they name keep their text keys, and a blob is looked up by the
  text either way.

No view reads them; the projection rebuild decodes `owner_boot_id` (by column). No column is
added; PostgreSQL stores text. anvilctl before 0018 cannot read those rows, so this
revision makes it refuse the database ("written by a newer version") instead. A downgrade
changes nothing: rows written compactly stay, and anvilctl before 0018 cannot read them.
"""

from __future__ import annotations

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
