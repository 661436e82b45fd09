"""current-state projection, content-addressed snapshot bodies, indexes for the README queries

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-30

- The projection (`tx_current`, `identity_current`, `serving_intervals`,
  `gpu_owner_current`, `lock_held`): derived from history and written in the same database
  transaction as the history row each summarizes (`persistence.projection`). It is not
  history: mutable, no append-only triggers, not covered by the audit chain (anyone can
  rebuild it from history, and `audit verify` compares it with a rebuild). Filled here
  from the existing history.
- `snapshot_blobs`: a snapshot's body once per distinct content, keyed by its SHA-256;
  history (append-only, covered). `snapshots` rows written from now on leave
  `body_json` empty and refer to their blob by `sha256`; older rows keep their bodies
  (history is not rewritten).
- The views that asked history for "the latest row" (`v_transactions`, `v_gpu_owners`,
  `v_serving_history`, and `v_promotions` on top of `v_transactions`) read the
  projection; their columns are unchanged.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from anvil_ctl.persistence import projection
from anvil_ctl.persistence.ddl import allow_rewrites, drop_append_only, make_append_only, refuse_rewrites
from anvil_ctl.persistence.models import Base

revision = "0007"
down_revision = "0005"
branch_labels = None
depends_on = None

HISTORY_AT_0007 = ("snapshot_blobs",)

V_PROMOTIONS = """
    CREATE VIEW v_promotions AS
    SELECT t.tx_id, t.state, t.created_at, t.slot, a.approved_by, a.decision_id,
           d.outcome, d.reclassifies, d.waiver_ids_json,
           CASE WHEN d.waiver_ids_json <> '[]' THEN 1 ELSE 0 END AS relied_on_waiver
    FROM v_transactions t
    JOIN approvals a ON a.tx_id = t.tx_id
    JOIN decisions d ON d.id = a.decision_id
    WHERE t.kind = 'promote'
"""


def _drop_views() -> None:
    for view in ("v_promotions", "v_serving_history", "v_gpu_owners", "v_transactions"):
        op.execute(f"DROP VIEW IF EXISTS {view}")


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("snapshot_blobs"):  # a downgrade keeps it
        op.create_table(
            "snapshot_blobs",
            sa.Column("sha256", sa.String(length=64), nullable=False),
            sa.Column("body_json", sa.Text(), nullable=False),
            sa.Column("at", sa.String(length=32), nullable=False),
            sa.PrimaryKeyConstraint("sha256"),
        )
    make_append_only("snapshot_blobs")
    refuse_rewrites(Base.metadata.tables["snapshot_blobs"])
    op.create_table(
        "tx_current",
        sa.Column("tx_id", sa.String(length=36), nullable=False),
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
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("identity_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("slot", "role"),
    )
    op.create_table(
        "serving_intervals",
        sa.Column("identity_id", sa.Integer(), autoincrement=False, nullable=False),
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
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("role"),
    )

    op.create_table(
        "lock_held",
        sa.Column("lock_id", sa.String(length=36), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("lock_id"),
    )
    op.create_index("ix_lock_held_host_since", "lock_held", ["host", "since"])
    op.create_index("ix_lock_held_since", "lock_held", ["since"])
    # Promotions that relied on a waiver: the few decisions with waivers, then their approvals.
    op.create_index(
        "ix_decisions_waived",
        "decisions",
        ["id"],
        sqlite_where=sa.text("waiver_ids_json <> '[]'"),
        postgresql_where=sa.text("waiver_ids_json <> '[]'"),
    )
    op.create_index("ix_approvals_decision_id", "approvals", ["decision_id"])
    # A candidate's standing decision: its identity's newest decisions first (history index).
    op.create_index("ix_decisions_identity_digest_at", "decisions", ["identity_digest", "at", "id"])

    session = Session(bind=op.get_bind())
    try:
        projection.write_rebuilt(session)
        session.flush()
    finally:
        session.close()

    _drop_views()
    op.execute(
        """
        CREATE VIEW v_transactions AS
        SELECT tx_id, kind, slot, created_at, state, reason, updated_at, owner_host, owner_pid
        FROM tx_current
        """
    )
    op.execute(
        """
        CREATE VIEW v_gpu_owners AS
        SELECT role, container_id, tx_id, mode, slot, since
        FROM gpu_owner_current
        """
    )
    op.execute(
        """
        CREATE VIEW v_serving_history AS
        SELECT serving_intervals.slot, identities.container_id, identities.served_model,
               identities.image_id, identities.digest, identities.body_json AS identity_json,
               serving_intervals.tx_id, serving_intervals.served_from, serving_intervals.served_until
        FROM serving_intervals JOIN identities ON identities.id = serving_intervals.identity_id
        """
    )
    op.execute(V_PROMOTIONS)


def downgrade() -> None:
    _drop_views()
    # The views of 0001, 0002 and 0003, reading history.
    op.execute(
        """
        CREATE VIEW v_transactions AS
        SELECT t.id AS tx_id, t.kind, t.slot, t.created_at,
               (SELECT s.state FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS state,
               (SELECT s.reason FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS reason,
               (SELECT s.at FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS updated_at,
               t.owner_host, t.owner_pid
        FROM transactions t
        """
    )
    op.execute(
        """
        CREATE VIEW v_gpu_owners AS
        SELECT e.role, e.container_id, e.tx_id, e.mode, e.slot, e.at AS since
        FROM gpu_ownership_events e
        WHERE e.event = 'claim'
          AND e.id = (SELECT max(x.id) FROM gpu_ownership_events x WHERE x.role = e.role)
        """
    )
    op.execute(
        """
        CREATE VIEW v_serving_history AS
        SELECT c.slot, c.container_id, c.served_model, c.image_id, c.digest,
               c.identity_json, c.tx_id, c.at AS served_from,
               LEAD(c.at) OVER (PARTITION BY c.slot ORDER BY c.id) AS served_until
        FROM (
            SELECT i.id, i.slot, i.container_id, i.served_model, i.image_id, i.digest,
                   i.body_json AS identity_json, i.tx_id, i.at
            FROM identities i JOIN v_transactions t ON t.tx_id = i.tx_id
            WHERE i.role = 'incumbent' AND t.state = 'committed'
              AND i.id = (SELECT max(j.id) FROM identities j
                          WHERE j.tx_id = i.tx_id AND j.role = 'incumbent')
        ) c
        """
    )
    op.execute(V_PROMOTIONS)
    op.drop_index("ix_decisions_identity_digest_at", table_name="decisions")
    op.drop_index("ix_decisions_waived", table_name="decisions")
    op.drop_index("ix_approvals_decision_id", table_name="approvals")
    for table in ("lock_held", "gpu_owner_current", "serving_intervals", "identity_current", "tx_current"):
        op.drop_table(table)
    # Snapshot rows written since 0007 hold no body: theirs are here. A downgrade keeps
    # the table and its rows (history that older code cannot read, but must not lose).
    allow_rewrites("snapshot_blobs")
    drop_append_only("snapshot_blobs")
