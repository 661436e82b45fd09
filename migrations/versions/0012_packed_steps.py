"""packed step details: a step's large detail compressed on SQLite

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

From now on `step_events.detail_json` is a `coltypes.PackedJSON` column: on SQLite a
detail of 128 bytes or more (the VRAM readings of `release-vram` and
`vram-after-acceptance`, a started container's identity) is stored zlib-compressed
behind the tag `00 7a` when that is smaller, read back as the same text; a row's digest
is over that text, so rows of both forms verify alike, and every row written before
(text) reads as it did. No column is added.

anvilctl before 0012 cannot read a packed detail (it would fail to decode it, and
`audit verify` would report the row), so this revision exists to make it refuse the
database ("written by a newer version") instead. A downgrade changes nothing: rows
written packed stay (history is not rewritten), and anvilctl before 0012 cannot read them.
"""

from __future__ import annotations

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
