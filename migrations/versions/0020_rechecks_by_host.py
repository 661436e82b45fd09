"""rechecks by host and lean: `ix_rechecks_host_key_id`, and packed assertions

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

`audit rechecks` and `fleet status` read a host's newest recheck runs. Filtered by
`host_id = :host OR host_id IS NULL` (the first host's rows may have none) they walked the
table from its newest row: every run other hosts recorded since, and the whole table for a
host that never rechecked (`fleet status` asks for every host). An index on the host as one
value, `coalesce(host_id, 1)` (`scope.host_key`), and the key answers each by a search, on
SQLite and on PostgreSQL alike. About 20 bytes per recheck run.

From now on `rechecks.assertions_json` is a `coltypes.PackedJSON` column, as step details are
since 0012: on SQLite it is stored compressed against the preset dictionary when that is
smaller (a run's assertions 1,722 -> 457 bytes on the fake host; a cron recheck every 15
minutes wrote ~2.3 KB per run), read back as the same text; a row's digest is over that text,
so rows of both forms verify alike and every row written before reads as it did. anvilctl
before 0020 would read a packed value as bytes and `audit verify` would report the row: this
revision makes it refuse the database instead. A downgrade drops the index; rows written
packed stay (history is not rewritten).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

NAME = "ix_rechecks_host_key_id"


def upgrade() -> None:
    # the expression as text, as `persistence.scope.HOST_KEY_SQL` has it (a migration does not
    # import the code it migrates for)
    op.create_index(NAME, "rechecks", [sa.text("coalesce(host_id, 1)"), "id"])


def downgrade() -> None:
    op.drop_index(NAME, table_name="rechecks")
