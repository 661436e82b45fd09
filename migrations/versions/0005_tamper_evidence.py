"""tamper evidence: the chain covers every history row; REPLACE and TRUNCATE refused

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

- `audit_journal.rows_json`: the history rows each entry covers ([table, key, digest]).
- `evidence_manifests`: the SHA-256 of each evidence manifest written (qualify, export),
  back-filled from the decisions that recorded one.
- `audit_checkpoints`: the positions `audit verify` found intact (incremental verify).
- SQLite: a BEFORE INSERT trigger on every history table refuses a row whose key
  exists (`INSERT OR REPLACE` deletes without firing DELETE triggers). PostgreSQL:
  a statement trigger refuses TRUNCATE.
- Rows written before this revision are brought under the chain by `audit.cover`
  entries appended here; from now on each write's own entry covers its rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from anvil_ctl.persistence import audit
from anvil_ctl.persistence.coverage import refs_of_rows
from anvil_ctl.persistence.ddl import (
    allow_rewrites,
    drop_append_only,
    make_append_only,
    refuse_rewrites,
)
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES_0005, AuditEntry, Base
from anvil_ctl.persistence.store import utcnow

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COVER_BATCH = 1000


# The history tables at this revision, frozen: a table added later is covered from its own
# migration on, and the models may have moved on by the time an old database upgrades.
HISTORY_AT_0005 = (
    "transactions",
    "transaction_states",
    "step_events",
    "snapshots",
    "snapshot_diffs",
    "identities",
    "locks",
    "lock_releases",
    "gpu_ownership_events",
    "evidence",
    "decisions",
    "waivers",
    "waiver_revocations",
    "approvals",
    "rechecks",
    "shm_marks",
    "evidence_manifests",
    "audit_checkpoints",
)


def _tables() -> list[str]:
    return [*HISTORY_AT_0005, AuditEntry.__tablename__]


def _as_it_is(name: str) -> sa.Table:
    """The table with the columns the database has now (not the models' later ones)."""
    return sa.Table(name, sa.MetaData(), autoload_with=op.get_bind())


def upgrade() -> None:
    op.add_column(
        "audit_journal", sa.Column("rows_json", sa.Text(), nullable=False, server_default="[]")
    )
    op.create_table(
        "evidence_manifests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=True),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_evidence_manifests_tx_id", "evidence_manifests", ["tx_id"], unique=False)
    op.create_index("ix_evidence_manifests_sha256", "evidence_manifests", ["sha256"], unique=False)
    op.create_table(
        "audit_checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=True),
        sa.Column("counts_json", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("entries_checked", sa.Integer(), nullable=False),
        sa.Column("rows_checked", sa.Integer(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    for table in APPEND_ONLY_TABLES_0005:
        make_append_only(table)
    for table in _tables():
        refuse_rewrites(Base.metadata.tables[table])

    op.execute(
        """
        INSERT INTO evidence_manifests (tx_id, kind, sha256, source_sha256, at)
        SELECT d.tx_id, 'qualify', d.manifest_sha256, NULL, min(d.at)
        FROM decisions d
        WHERE d.tx_id IS NOT NULL AND d.manifest_sha256 <> '' AND d.reclassifies IS NULL
        GROUP BY d.tx_id, d.manifest_sha256
        ORDER BY min(d.at)
        """
    )
    _cover_existing_rows()


def _cover_existing_rows() -> None:
    """Append `audit.cover` entries for every history row written before this revision."""
    session = Session(bind=op.get_bind())
    try:
        for name in HISTORY_AT_0005:
            table = _as_it_is(name)
            (pk,) = table.primary_key.columns
            rows = session.execute(sa.select(table).order_by(pk)).mappings()
            refs = refs_of_rows(table, rows)
            for i in range(0, len(refs), COVER_BATCH):
                batch = refs[i : i + COVER_BATCH]
                audit.append(
                    session,
                    at=utcnow(),
                    tx_id=None,
                    event="audit.cover",
                    payload={"migration": revision, "table": name, "rows": len(batch)},
                    rows=batch,
                )
                session.flush()
    finally:
        session.close()


def downgrade() -> None:
    for table in _tables():
        allow_rewrites(table)
    for table in APPEND_ONLY_TABLES_0005:
        drop_append_only(table)
    op.drop_table("audit_checkpoints")
    op.drop_index("ix_evidence_manifests_sha256", table_name="evidence_manifests")
    op.drop_index("ix_evidence_manifests_tx_id", table_name="evidence_manifests")
    op.drop_table("evidence_manifests")
    # The cover entries stay (the journal is append-only); their hashes include the rows they
    # covered, so a database taken back to 0003 no longer verifies them.
    op.drop_column("audit_journal", "rows_json")
