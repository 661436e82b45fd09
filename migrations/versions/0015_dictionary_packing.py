"""dictionary packing: JSON bodies deflated against a preset dictionary on SQLite

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

From now on, on SQLite, a `coltypes.PackedJSON` value (a step's detail, a transaction's
arguments, a snapshot body, a diff) of 16 bytes or more is stored, when that is smaller,
as raw deflate against the preset dictionary `jsondict.JSON_V1` behind the tag `00 79`
(the bodies' member names, which every body of a kind repeats, cost almost nothing), and
read back as the text its row digest covers; values packed before (`00 7a`, a zlib stream)
and text values read as they did, so rows of every form verify together. No column is
added; PostgreSQL stores text, as before.

anvilctl before 0015 cannot read a `00 79` value (it would fail to decompress it, and
`audit verify` would report the row), so this revision makes it refuse the database
("written by a newer version") instead. A downgrade changes nothing: rows written in the
new form stay (history is not rewritten), and anvilctl before 0015 cannot read them.
"""

from __future__ import annotations

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
