"""lean journal: identity bodies stored once, the journal's unused indexes dropped

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

- `identity_bodies`: an identity's body once per distinct content, keyed by its digest
  (the SHA-256 of the body); history (append-only, covered). `identities` rows written
  from now on leave `body_json` empty and name their body by `digest`; older rows keep
  theirs (history is not rewritten). `v_serving_history.identity_json` reads either.
- `audit_journal` loses `ix_audit_journal_tx_id` and the UNIQUE constraint on `hash`:
  no query looks an entry up by either (verify walks by id), and together they were a
  fifth of the journal's bytes. SQLite cannot drop a constraint in place, so the table
  is copied (rows, ids and values as they are, so every hash still verifies) and its
  append-only triggers are put back; the REPLACE trigger now checks the id only.
- `identities` loses `ix_identities_digest` and `ix_identities_container_id`: no query
  looks an identity up by either (by slot and role, by transaction, by id; a container
  ID prefix is matched with LIKE, which those indexes did not serve).
- Entries appended from now on are lean (`persistence.audit`): no new column, each
  entry's form tells which it is, and the old ones verify as before.

A downgrade keeps `identity_bodies`, its rows and its triggers (history that older
code cannot read, but must not lose) and restores the indexes (the hash one as a unique
index); lean entries are not rewritten, and anvilctl before 0010 cannot verify them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import drop_append_only, make_append_only, refuse_rewrites
from anvil_ctl.persistence.models import Base

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

JOURNAL = "audit_journal"
COLUMNS = "id, at, tx_id, event, payload_json, prev_hash, hash, rows_json, host_id"

V_SERVING_HISTORY = """
    CREATE VIEW v_serving_history AS
    SELECT serving_intervals.slot, identities.container_id, identities.served_model,
           identities.image_id, identities.digest, {identity_json} AS identity_json,
           serving_intervals.tx_id, serving_intervals.served_from, serving_intervals.served_until,
           serving_intervals.host_id, h.name AS host
    FROM serving_intervals JOIN identities ON identities.id = serving_intervals.identity_id{join}
    LEFT JOIN hosts h ON h.id = serving_intervals.host_id
"""
"""As migration 0009 (the fleet) left it, the identity's body read from either place."""


def _serving_history(*, bodies: bool) -> None:
    op.execute("DROP VIEW IF EXISTS v_serving_history")
    if bodies:
        op.execute(
            V_SERVING_HISTORY.format(
                identity_json="COALESCE(NULLIF(identities.body_json, ''), identity_bodies.body_json)",
                join="\n    LEFT JOIN identity_bodies ON identity_bodies.digest = identities.digest",
            )
        )
    else:
        op.execute(V_SERVING_HISTORY.format(identity_json="identities.body_json", join=""))


def _copy_journal_sqlite(*, unique_hash: bool) -> None:
    """Rebuild the journal table on SQLite: same rows, the hash UNIQUE or not."""
    drop_append_only(JOURNAL)
    op.execute(f"DROP TRIGGER IF EXISTS {JOURNAL}_no_replace")
    op.execute(
        "CREATE TABLE audit_journal_copy (id INTEGER NOT NULL, at VARCHAR(32) NOT NULL, "
        "tx_id VARCHAR(36), event VARCHAR(64) NOT NULL, payload_json TEXT NOT NULL, "
        "prev_hash VARCHAR(64) NOT NULL, hash VARCHAR(64) NOT NULL, "
        "rows_json TEXT DEFAULT '[]' NOT NULL, host_id SMALLINT REFERENCES hosts (id), PRIMARY KEY (id)"
        + (", UNIQUE (hash))" if unique_hash else ")")
    )
    op.execute(f"INSERT INTO audit_journal_copy ({COLUMNS}) SELECT {COLUMNS} FROM {JOURNAL} ORDER BY id")
    op.execute(f"DROP TABLE {JOURNAL}")
    op.execute(f"ALTER TABLE audit_journal_copy RENAME TO {JOURNAL}")
    make_append_only(JOURNAL)
    table = Base.metadata.tables[JOURNAL]
    if unique_hash:  # what refuse_rewrites made of the table before 0010: id or hash
        op.execute(
            f"CREATE TRIGGER {JOURNAL}_no_replace BEFORE INSERT ON {JOURNAL} "
            f"WHEN EXISTS (SELECT 1 FROM {JOURNAL} WHERE (id = NEW.id) OR (hash = NEW.hash)) "
            f"BEGIN SELECT RAISE(ABORT, '{JOURNAL} is append-only: a row with this key exists'); END"
        )
    else:
        refuse_rewrites(table)


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if not inspector.has_table("identity_bodies"):  # a downgrade keeps it, with its triggers
        op.create_table(
            "identity_bodies",
            sa.Column("digest", sa.String(length=64), nullable=False),
            sa.Column("body_json", sa.Text(), nullable=False),
            sa.Column("at", sa.String(length=32), nullable=False),
            sa.PrimaryKeyConstraint("digest"),
        )
        make_append_only("identity_bodies")
        refuse_rewrites(Base.metadata.tables["identity_bodies"])
    _serving_history(bodies=True)

    op.drop_index("ix_identities_digest", table_name="identities")
    op.drop_index("ix_identities_container_id", table_name="identities")
    op.drop_index("ix_audit_journal_tx_id", table_name=JOURNAL)
    if bind.dialect.name == "sqlite":
        _copy_journal_sqlite(unique_hash=False)
    else:
        for constraint in inspector.get_unique_constraints(JOURNAL):
            if constraint["column_names"] == ["hash"] and constraint["name"]:
                op.drop_constraint(constraint["name"], JOURNAL, type_="unique")


def downgrade() -> None:
    _serving_history(bodies=False)
    if op.get_bind().dialect.name == "sqlite":
        _copy_journal_sqlite(unique_hash=True)
    else:
        op.create_unique_constraint("audit_journal_hash_key", JOURNAL, ["hash"])
    op.create_index("ix_audit_journal_tx_id", JOURNAL, ["tx_id"], unique=False)
    op.create_index("ix_identities_digest", "identities", ["digest"], unique=False)
    op.create_index("ix_identities_container_id", "identities", ["container_id"], unique=False)
