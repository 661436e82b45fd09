"""fleet: hosts, every history row names its host, the projection keyed by host

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30

- `hosts`: one row per host of the fleet (its `anvil.toml` name, the machine id that
  claimed it, the boot id then); history, append-only and covered by the chain. No row
  is written here: the first command that opens the database registers its host, and
  that host is the database's first (id 1).
- `host_id` on every history table but `snapshot_blobs` (a body is stored once per
  content, whichever host recorded it): nullable, and NULL in every row written before
  this revision, which means the first host. Nothing is rewritten: history is
  append-only (on PostgreSQL even for this role) and a row's digest leaves NULL columns
  out, so every covered row keeps the digest its audit entry recorded.
- The projection is derived, so it is dropped, created again with `host_id` (NOT NULL,
  first in the keys of `identity_current` and `gpu_owner_current`) and rebuilt from
  history.
- The views that answer "which host" gain `host_id` and `host` (the host's name):
  `v_transactions`, `v_identities`, `v_serving_history`, `v_gpu_owners`, `v_promotions`
  (views only ever grow).

A downgrade keeps `hosts` and the `host_id` columns (history that older code ignores but
must not lose: dropping a column that holds values would change those rows' digests),
and gives the projection and the views back their 0008 shape.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from anvil_ctl.persistence import projection
from anvil_ctl.persistence.ddl import make_append_only, refuse_rewrites
from anvil_ctl.persistence.models import Base

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

HOST_TABLES_0009 = (
    "transactions",
    "transaction_states",
    "step_events",
    "snapshots",
    "snapshot_diffs",
    "identities",
    "locks",
    "lock_releases",
    "audit_journal",
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

PROJECTION = ("tx_current", "identity_current", "serving_intervals", "gpu_owner_current", "lock_held")
VIEWS = ("v_promotions", "v_serving_history", "v_gpu_owners", "v_identities", "v_transactions")


def _host_id(*, key: bool = False) -> sa.Column[int]:
    return sa.Column(
        "host_id", sa.SmallInteger(), nullable=False, server_default=sa.text("1"), primary_key=key
    )


def _create_projection(fleet: bool) -> None:
    """The projection's tables as 0007 made them, with `host_id` when `fleet`."""
    host: list[sa.Column[int]] = [_host_id()] if fleet else []
    keyed: list[sa.Column[int]] = [_host_id(key=True)] if fleet else []
    op.create_table(
        "tx_current",
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        *host,
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state_id", sa.Integer(), nullable=False),
        sa.Column("unresolved", sa.Integer(), nullable=False),
        sa.Column("owner_pid", sa.Integer(), nullable=False),
        sa.Column("owner_host", sa.String(length=255), nullable=False),
        sa.Column("owner_boot_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("tx_id"),
    )
    op.create_index("ix_tx_current_state", "tx_current", ["state"])
    op.create_index("ix_tx_current_created_at", "tx_current", ["created_at"])
    op.create_index("ix_tx_current_kind_created_at", "tx_current", ["kind", "created_at"])
    op.create_index("ix_tx_current_slot_created_at", "tx_current", ["slot", "created_at"])
    op.create_index(
        "ix_tx_current_unresolved",
        "tx_current",
        ["created_at"],
        sqlite_where=sa.text("unresolved = 1"),
        postgresql_where=sa.text("unresolved = 1"),
    )
    op.create_table(
        "identity_current",
        *keyed,
        sa.Column("slot", sa.String(length=64), nullable=False, primary_key=True),
        sa.Column("role", sa.String(length=16), nullable=False, primary_key=True),
        sa.Column("identity_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
    )
    op.create_table(
        "serving_intervals",
        sa.Column("identity_id", sa.Integer(), autoincrement=False, nullable=False),
        *host,
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("served_from", sa.String(length=32), nullable=False),
        sa.Column("served_until", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("identity_id"),
    )
    op.create_index("ix_serving_intervals_slot_from", "serving_intervals", ["slot", "served_from"])
    op.create_index("ix_serving_intervals_from", "serving_intervals", ["served_from"])
    op.create_index("ix_serving_intervals_tx_id", "serving_intervals", ["tx_id"])
    op.create_table(
        "gpu_owner_current",
        *keyed,
        sa.Column("role", sa.String(length=64), nullable=False, primary_key=True),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
    )
    op.create_table(
        "lock_held",
        sa.Column("lock_id", sa.String(length=36), nullable=False),
        *host,
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("lock_id"),
    )
    op.create_index("ix_lock_held_host_since", "lock_held", ["host", "since"])
    op.create_index("ix_lock_held_since", "lock_held", ["since"])
    if fleet:
        op.create_index("ix_tx_current_host_created_at", "tx_current", ["host_id", "created_at"])
        op.create_index(
            "ix_serving_intervals_host_slot_from", "serving_intervals", ["host_id", "slot", "served_from"]
        )
        op.create_index("ix_lock_held_host_id_since", "lock_held", ["host_id", "since"])


def _rebuild_projection(fleet: bool) -> None:
    for table in PROJECTION:
        op.drop_table(table)
    _create_projection(fleet)
    session = Session(bind=op.get_bind())
    try:
        projection.write_rebuilt(session)
        session.flush()
    finally:
        session.close()


def _drop_views() -> None:
    # first: a PostgreSQL view holds on to the tables it reads
    for view in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {view}")


def _views(fleet: bool) -> None:
    # The host's name for a row: NULL host_id (written before 0009) is the first host's.
    tx_host = ", c.host_id, h.name AS host" if fleet else ""
    tx_join = " LEFT JOIN hosts h ON h.id = c.host_id" if fleet else ""
    op.execute(
        f"""
        CREATE VIEW v_transactions AS
        SELECT c.tx_id, c.kind, c.slot, c.created_at, c.state, c.reason, c.updated_at,
               c.owner_host, c.owner_pid{tx_host}
        FROM tx_current c{tx_join}
        """
    )
    id_host = ", coalesce(i.host_id, 1) AS host_id, h.name AS host" if fleet else ""
    id_join = " LEFT JOIN hosts h ON h.id = coalesce(i.host_id, 1)" if fleet else ""
    op.execute(
        f"""
        CREATE VIEW v_identities AS
        SELECT i.id, i.slot, i.role, i.container_id, i.image_id, i.served_model,
               i.digest, i.tx_id, i.at AS recorded_at{id_host}
        FROM identities i{id_join}
        """
    )
    own_host = ", c.host_id, h.name AS host" if fleet else ""
    op.execute(
        f"""
        CREATE VIEW v_gpu_owners AS
        SELECT c.role, c.container_id, c.tx_id, c.mode, c.slot, c.since{own_host}
        FROM gpu_owner_current c{tx_join}
        """
    )
    sv_host = ", serving_intervals.host_id, h.name AS host" if fleet else ""
    sv_join = " LEFT JOIN hosts h ON h.id = serving_intervals.host_id" if fleet else ""
    op.execute(
        f"""
        CREATE VIEW v_serving_history AS
        SELECT serving_intervals.slot, identities.container_id, identities.served_model,
               identities.image_id, identities.digest, identities.body_json AS identity_json,
               serving_intervals.tx_id, serving_intervals.served_from,
               serving_intervals.served_until{sv_host}
        FROM serving_intervals JOIN identities ON identities.id = serving_intervals.identity_id{sv_join}
        """
    )
    pr_host = ", t.host_id, t.host" if fleet else ""
    op.execute(
        f"""
        CREATE VIEW v_promotions AS
        SELECT t.tx_id, t.state, t.created_at, t.slot, a.approved_by, a.decision_id,
               d.outcome, d.reclassifies, d.waiver_ids_json,
               CASE WHEN d.waiver_ids_json <> '[]' THEN 1 ELSE 0 END AS relied_on_waiver{pr_host}
        FROM v_transactions t
        JOIN approvals a ON a.tx_id = t.tx_id
        JOIN decisions d ON d.id = a.decision_id
        WHERE t.kind = 'promote'
        """
    )


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if not inspector.has_table("hosts"):  # a downgrade keeps it
        op.create_table(
            "hosts",
            sa.Column("id", sa.SmallInteger(), autoincrement=True, nullable=False),
            sa.Column("name", sa.String(length=63), nullable=False),
            sa.Column("machine_id", sa.String(length=64), nullable=False),
            sa.Column("boot_id", sa.String(length=64), nullable=False),
            sa.Column("registered_at", sa.String(length=32), nullable=False),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("name"),
        )
        make_append_only("hosts")
        refuse_rewrites(Base.metadata.tables["hosts"])
    for table in HOST_TABLES_0009:
        if "host_id" in {c["name"] for c in inspector.get_columns(table)}:
            continue  # kept by a downgrade
        # ALTER TABLE ... ADD COLUMN on both dialects (no copy of the table, so its triggers
        # stay): a nullable column with a reference, NULL in every existing row. alembic would
        # add SQLite's reference as a separate constraint, which SQLite cannot ALTER in.
        if bind.dialect.name == "sqlite":
            op.execute(f"ALTER TABLE {table} ADD COLUMN host_id SMALLINT REFERENCES hosts (id)")
        else:
            op.add_column(table, sa.Column("host_id", sa.SmallInteger(), sa.ForeignKey("hosts.id"), nullable=True))
    _drop_views()
    _rebuild_projection(fleet=True)
    _views(fleet=True)


def downgrade() -> None:
    _drop_views()
    _rebuild_projection(fleet=False)
    _views(fleet=False)
