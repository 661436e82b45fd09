"""index the rechecks by host, newest first: `ix_rechecks_host_key_id`

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

`audit rechecks` and `fleet status` read a host's newest recheck runs. Filtered by
`host_id = :host OR host_id IS NULL` (the first host's rows may have none) they walked the
table from its newest row: every run other hosts recorded since, and the whole table for a
host that never rechecked (`fleet status` asks for every host). An index on the host as one
value, `coalesce(host_id, 1)` (`scope.host_key`), and the key answers each by a search, on
SQLite and on PostgreSQL alike. About 20 bytes per recheck run.
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
