"""baseline: the schema of the first release

Revision ID: baseline
Revises:
Create Date: 2026-12-04

The whole schema in one revision: history tables (append-only by trigger), the audit
journal, the current-state projection and the operator views. A database stamped with a
revision from before it is refused (`persistence.migrate.RETIRED`). From the first release
on, revisions are added after this one and never squashed (`migrations/README`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import make_append_only

revision = "baseline"
down_revision = None
branch_labels = None
depends_on = None

APPEND_ONLY = (
    "hosts",
    "transactions",
    "transaction_states",
    "step_events",
    "snapshots",
    "snapshot_blobs",
    "snapshot_diffs",
    "identities",
    "identity_bodies",
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
    "audit_journal",
)
"""History and the journal: triggers refuse UPDATE, DELETE, REPLACE (SQLite), TRUNCATE (PostgreSQL)."""

VIEWS = {
    "v_transactions": """
        CREATE VIEW v_transactions AS
        SELECT c.tx_id, c.kind, c.slot, c.created_at, c.state, c.reason, c.updated_at,
               c.owner_host, c.owner_pid, c.host_id, h.name AS host
        FROM tx_current c LEFT JOIN hosts h ON h.id = c.host_id
    """,
    "v_steps": """
        CREATE VIEW v_steps AS
        SELECT e.tx_id, e.seq, e.step, e.phase, e.event, e.at, e.detail_json FROM step_events e
    """,
    "v_identities": """
        CREATE VIEW v_identities AS
        SELECT i.id, i.slot, i.role, i.container_id, i.image_id, i.served_model, i.digest, i.tx_id,
               i.at AS recorded_at, i.host_id, h.name AS host
        FROM identities i LEFT JOIN hosts h ON h.id = i.host_id
    """,
    "v_serving_history": """
        CREATE VIEW v_serving_history AS
        SELECT s.slot, i.container_id, i.served_model, i.image_id, i.digest, b.body_json AS identity_json,
               s.tx_id, s.served_from, s.served_until, s.host_id, h.name AS host
        FROM serving_intervals s JOIN identities i ON i.id = s.identity_id
        JOIN identity_bodies b ON b.digest = i.digest
        LEFT JOIN hosts h ON h.id = s.host_id
    """,
    "v_gpu_owners": """
        CREATE VIEW v_gpu_owners AS
        SELECT c.role, c.container_id, c.tx_id, c.mode, c.slot, c.since, c.host_id, h.name AS host
        FROM gpu_owner_current c LEFT JOIN hosts h ON h.id = c.host_id
    """,
    "v_decisions": """
        CREATE VIEW v_decisions AS
        SELECT d.id AS decision_id, d.tx_id, d.slot, d.identity_digest, d.container_id,
               d.outcome, d.profile, d.reclassifies, d.waiver_ids_json, d.reasons_json,
               d.at AS decided_at
        FROM decisions d
    """,
    "v_promotions": """
        CREATE VIEW v_promotions AS
        SELECT t.tx_id, t.state, t.created_at, t.slot, a.approved_by, a.decision_id,
               d.outcome, d.reclassifies, d.waiver_ids_json,
               CASE WHEN d.waiver_ids_json <> '[]' THEN 1 ELSE 0 END AS relied_on_waiver, t.host_id, t.host
        FROM v_transactions t
        JOIN approvals a ON a.tx_id = t.tx_id
        JOIN decisions d ON d.id = a.decision_id
        WHERE t.kind = 'promote'
    """,
    "v_waivers": """
        CREATE VIEW v_waivers AS
        SELECT w.id AS waiver_id, w.policy, w.roles_json, w.recipe_digest, w.value,
               w.approved_by, w.reason, w.created_at, w.expires_at,
               r.at AS revoked_at, r.by AS revoked_by, w.gates_json
        FROM waivers w LEFT JOIN waiver_revocations r ON r.waiver_id = w.id
    """,
    "v_rechecks": """
        CREATE VIEW v_rechecks AS
        SELECT id, slot, passed, failed_json, snapshot_sha256, at FROM rechecks
    """,
    "v_shm_marks": """
        CREATE VIEW v_shm_marks AS
        SELECT id, boot_id, path, dev, ino, container_id, at AS seen_at FROM shm_marks
    """,
}
"""The operator's query surface (README): their columns only ever grow."""

PROJECTION = ("tx_current", "identity_current", "serving_intervals", "gpu_owner_current", "lock_held")


def upgrade() -> None:
    op.create_table(
        "gpu_owner_current",
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("host_id", "role"),
    )
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
    op.create_table(
        "identity_bodies",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("body_json", sa.Text(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_table(
        "identity_current",
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("identity_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("host_id", "slot", "role"),
    )
    op.create_table(
        "lock_held",
        sa.Column("lock_id", sa.String(length=36), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("lock_id"),
    )
    with op.batch_alter_table("lock_held", schema=None) as batch_op:
        batch_op.create_index("ix_lock_held_host_id_since", ["host_id", "since"], unique=False)
        batch_op.create_index("ix_lock_held_host_since", ["host", "since"], unique=False)
        batch_op.create_index("ix_lock_held_since", ["since"], unique=False)

    op.create_table(
        "serving_intervals",
        sa.Column("identity_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("served_from", sa.String(length=32), nullable=False),
        sa.Column("served_until", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("identity_id"),
    )
    with op.batch_alter_table("serving_intervals", schema=None) as batch_op:
        batch_op.create_index("ix_serving_intervals_from", ["served_from"], unique=False)
        batch_op.create_index(
            "ix_serving_intervals_host_slot_from", ["host_id", "slot", "served_from"], unique=False
        )
        batch_op.create_index("ix_serving_intervals_slot_from", ["slot", "served_from"], unique=False)
        batch_op.create_index("ix_serving_intervals_tx_id", ["tx_id"], unique=False)

    op.create_table(
        "snapshot_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("body_json", sa.LargeBinary(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_table(
        "tx_current",
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
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
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("tx_id"),
    )
    with op.batch_alter_table("tx_current", schema=None) as batch_op:
        batch_op.create_index("ix_tx_current_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_tx_current_host_created_at", ["host_id", "created_at"], unique=False)
        batch_op.create_index("ix_tx_current_kind_created_at", ["kind", "created_at"], unique=False)
        batch_op.create_index(
            "ix_tx_current_revision",
            ["host_id", "slot", "revision"],
            unique=False,
            sqlite_where=sa.text("revision IS NOT NULL"),
            postgresql_where=sa.text("revision IS NOT NULL"),
        )
        batch_op.create_index("ix_tx_current_slot_created_at", ["slot", "created_at"], unique=False)
        batch_op.create_index("ix_tx_current_state", ["state"], unique=False)
        batch_op.create_index(
            "ix_tx_current_unresolved",
            ["created_at"],
            unique=False,
            sqlite_where=sa.text("unresolved = 1"),
            postgresql_where=sa.text("unresolved = 1"),
        )

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
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "audit_journal",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("rows_json", sa.Text(), server_default="[]", nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "evidence_manifests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=True),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("evidence_manifests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evidence_manifests_sha256"), ["sha256"], unique=False)
        batch_op.create_index(batch_op.f("ix_evidence_manifests_tx_id"), ["tx_id"], unique=False)

    op.create_table(
        "gpu_ownership_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("gpu_ownership_events", schema=None) as batch_op:
        batch_op.create_index("ix_gpu_ownership_role_id", ["role", "id"], unique=False)

    op.create_table(
        "locks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("command", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("since", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "rechecks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed_json", sa.Text(), nullable=False),
        sa.Column("assertions_json", sa.LargeBinary(), nullable=False),
        sa.Column("snapshot_sha256", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rechecks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rechecks_at"), ["at"], unique=False)
        batch_op.create_index("ix_rechecks_host_id_id", ["host_id", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_rechecks_slot"), ["slot"], unique=False)

    op.create_table(
        "shm_marks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("dev", sa.BigInteger(), nullable=False),
        sa.Column("ino", sa.BigInteger(), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("shm_marks", schema=None) as batch_op:
        batch_op.create_index("ix_shm_marks_boot_id_path", ["boot_id", "path"], unique=False)

    op.create_table(
        "transactions",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=True),
        sa.Column("args_json", sa.LargeBinary(), nullable=False),
        sa.Column("owner_pid", sa.Integer(), nullable=False),
        sa.Column("owner_host", sa.String(length=255), nullable=False),
        sa.Column("owner_boot_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("transactions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_transactions_created_at"), ["created_at"], unique=False)

    op.create_table(
        "waivers",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("roles_json", sa.Text(), nullable=False),
        sa.Column("recipe_digest", sa.String(length=64), nullable=True),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("approved_by", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(length=32), nullable=False),
        sa.Column("expires_at", sa.String(length=32), nullable=True),
        sa.Column("gates_json", sa.Text(), nullable=True),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "decisions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("identity_digest", sa.String(length=64), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("profile", sa.String(length=64), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("reclassifies", sa.String(length=64), nullable=True),
        sa.Column("waiver_ids_json", sa.Text(), nullable=False),
        sa.Column("reasons_json", sa.Text(), nullable=False),
        sa.Column("body_json", sa.Text(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["reclassifies"],
            ["decisions.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index("ix_decisions_at", ["at"], unique=False)
        batch_op.create_index(
            "ix_decisions_identity_digest_at", ["identity_digest", "at", "id"], unique=False
        )
        batch_op.create_index(
            "ix_decisions_reclassifies",
            ["reclassifies"],
            unique=False,
            sqlite_where=sa.text("reclassifies IS NOT NULL"),
            postgresql_where=sa.text("reclassifies IS NOT NULL"),
        )
        batch_op.create_index(batch_op.f("ix_decisions_tx_id"), ["tx_id"], unique=False)
        batch_op.create_index(
            "ix_decisions_waived",
            ["id"],
            unique=False,
            sqlite_where=sa.text("waiver_ids_json <> '[]'"),
            postgresql_where=sa.text("waiver_ids_json <> '[]'"),
        )

    op.create_table(
        "evidence",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("gate", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("classification", sa.String(length=64), nullable=False),
        sa.Column("artifact_path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evidence_tx_id"), ["tx_id"], unique=False)

    op.create_table(
        "identities",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("container_id", sa.String(length=64), nullable=False),
        sa.Column("image_id", sa.String(length=80), nullable=False),
        sa.Column("served_model", sa.String(length=255), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("identities", schema=None) as batch_op:
        batch_op.create_index("ix_identities_slot_role_id", ["slot", "role", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_identities_tx_id"), ["tx_id"], unique=False)

    op.create_table(
        "lock_releases",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("lock_id", sa.String(length=36), nullable=False),
        sa.Column("how", sa.String(length=16), nullable=False),
        sa.Column("by", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["lock_id"],
            ["locks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("lock_id"),
    )
    op.create_table(
        "snapshot_diffs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("before_sha256", sa.String(length=64), nullable=False),
        sa.Column("after_sha256", sa.String(length=64), nullable=False),
        sa.Column("equal", sa.Integer(), nullable=False),
        sa.Column("changes_json", sa.LargeBinary(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("snapshot_diffs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_snapshot_diffs_tx_id"), ["tx_id"], unique=False)

    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=True),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_snapshots_tx_id"), ["tx_id"], unique=False)

    op.create_table(
        "step_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=64), nullable=False),
        sa.Column("phase", sa.String(length=8), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("detail_json", sa.LargeBinary(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("step_events", schema=None) as batch_op:
        batch_op.create_index("ix_step_events_tx_id_id", ["tx_id", "id"], unique=False)

    op.create_table(
        "transaction_states",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("transaction_states", schema=None) as batch_op:
        batch_op.create_index("ix_transaction_states_tx_id_id", ["tx_id", "id"], unique=False)

    op.create_table(
        "waiver_revocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("waiver_id", sa.String(length=36), nullable=False),
        sa.Column("by", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["waiver_id"],
            ["waivers.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("waiver_id"),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tx_id", sa.String(length=36), nullable=False),
        sa.Column("decision_id", sa.String(length=64), nullable=False),
        sa.Column("approved_by", sa.String(length=255), nullable=False),
        sa.Column("at", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
        ),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tx_id"],
            ["transactions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.create_index("ix_approvals_decision_id", ["decision_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_approvals_tx_id"), ["tx_id"], unique=False)
    bind = op.get_bind()
    tables = sa.MetaData()
    tables.reflect(bind, only=APPEND_ONLY)
    for name in APPEND_ONLY:
        make_append_only(tables.tables[name])
    for view in VIEWS.values():
        op.execute(view)


def downgrade() -> None:
    for view in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    tables = sa.MetaData()
    tables.reflect(op.get_bind(), only=(*APPEND_ONLY, *PROJECTION))
    tables.drop_all(op.get_bind())
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS anvil_append_only()")
