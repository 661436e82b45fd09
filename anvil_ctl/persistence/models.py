"""ORM models of the state database.

Every table that records history is append-only (triggers refuse UPDATE, DELETE,
REPLACE and TRUNCATE on them; see `ddl` and the migrations) and every row of it
is covered by the hash-chained audit journal (`HISTORY_TABLES`, see `coverage`);
"current" facts are derived as the latest row, never updated in place. Timestamps are ISO-8601 UTC text
(`2026-09-02T12:15:45.123456Z`), which sorts and reads the same in sqlite3 and
PostgreSQL; on SQLite the `at` of the many-row history tables no view or query compares
(`CompactTime`, from migration 0013 on) is stored as 8 bytes and read back as that text.
JSON bodies are canonical JSON text so that their hashes are stable; the large ones
(`PackedJSON`) are stored compressed on SQLite (against a preset dictionary from migration
0015 on), read back as the same text.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from anvil_ctl.persistence.base import FIRST_HOST_ID, Base, Host, host_column, partial_index
from anvil_ctl.persistence.coltypes import (
    CompactTime,
    CompactUuid,
    HexDigest,
    ImageId,
    LinkTag,
    PackedDetail,
    PackedJSON,
)
from anvil_ctl.persistence.ledger_models import AuditCheckpoint, EvidenceManifestRow, ShmMarkRow
from anvil_ctl.persistence.rowrefs import PackedRows
from anvil_ctl.persistence.scope import HOST_KEY_SQL

GpuMode = Literal["exclusive", "split"]
"""How a serve owns its GPU roles (`anvil_ctl.gpu.ownership.Mode`; only these are written)."""


class Transaction(Base):
    __tablename__ = "transactions"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # no index: views filter tx_current (0019)
    slot: Mapped[str | None] = mapped_column(String(64))
    args_json: Mapped[str] = mapped_column(PackedJSON)
    owner_pid: Mapped[int] = mapped_column(Integer)
    owner_host: Mapped[str] = mapped_column(String(255))
    owner_boot_id: Mapped[str] = mapped_column(CompactUuid(64))  # 16 bytes on SQLite from 0018 on
    created_at: Mapped[str] = mapped_column(String(32), index=True)
    host_id: Mapped[int | None] = host_column()


class TransactionState(Base):
    __tablename__ = "transaction_states"
    __table_args__ = (Index("ix_transaction_states_tx_id_id", "tx_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"))
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    data_json: Mapped[str] = mapped_column(Text, default="{}")
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class StepEventRow(Base):
    """A step's intent or result. From migration 0016 on a row names its transaction by
    `tx_ref`, the integer key of the transaction's first (`planned`) state row, which names
    the transaction by its ID (`tx_id` is NULL); rows written before name it by `tx_id`.
    `v_steps` shows the ID either way; `transaction_steps` reads both."""

    __tablename__ = "step_events"
    __table_args__ = (
        partial_index("ix_step_events_tx_id_id", "tx_id", "id", where="tx_id IS NOT NULL"),
        partial_index("ix_step_events_tx_ref_id", "tx_ref", "id", where="tx_ref IS NOT NULL"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"))
    tx_ref: Mapped[int | None] = mapped_column(ForeignKey("transaction_states.id"))
    seq: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(64))
    phase: Mapped[str] = mapped_column(String(8))
    event: Mapped[str] = mapped_column(String(16))
    detail_json: Mapped[str] = mapped_column(PackedDetail, default="{}")
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class SnapshotRow(Base):
    __tablename__ = "snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    label: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(HexDigest(64))  # its blob's key; 32 bytes on SQLite from 0018
    body_json: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class SnapshotBlob(Base):
    """A snapshot's canonical body, stored once per distinct content (keyed by its SHA-256).

    History: append-only and covered by the chain like the `snapshots` rows that refer
    to it by `sha256` (from migration 0007 on, those rows leave `body_json` empty).
    """

    __tablename__ = "snapshot_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    body_json: Mapped[str] = mapped_column(PackedJSON)
    at: Mapped[str] = mapped_column(CompactTime(32))


class SnapshotDiff(Base):
    __tablename__ = "snapshot_diffs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    label: Mapped[str] = mapped_column(String(32))
    before_sha256: Mapped[str] = mapped_column(HexDigest(64))  # 32 bytes on SQLite from 0018 on
    after_sha256: Mapped[str] = mapped_column(HexDigest(64))
    equal: Mapped[int] = mapped_column(Integer)
    changes_json: Mapped[str] = mapped_column(PackedJSON)
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class IdentityRow(Base):
    """A serve's identity as observed at one moment; the latest row per (slot, role) is current.

    From migration 0010 on `body_json` is empty: the body is the `identity_bodies` row keyed
    by `digest` (the SHA-256 of the body); older rows hold it themselves. From migration 0017
    on, on SQLite, `digest`, `container_id` and `image_id` are stored as their 32 bytes and read
    back as the text the row digest covers; `v_identities` and `v_serving_history` show text.
    """

    __tablename__ = "identities"
    __table_args__ = (Index("ix_identities_slot_role_id", "slot", "role", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    slot: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(HexDigest(64))  # 32 bytes on SQLite from 0017 on
    container_id: Mapped[str] = mapped_column(HexDigest(64))  # likewise
    image_id: Mapped[str] = mapped_column(ImageId(80))  # likewise: `sha256:` and its 32 bytes
    served_model: Mapped[str] = mapped_column(String(255))
    body_json: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class IdentityBody(Base):
    """An identity's canonical body, stored once per distinct content (keyed by its SHA-256,
    the identity's `digest`). History: append-only and covered by the chain."""

    __tablename__ = "identity_bodies"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    body_json: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(CompactTime(32))


class LockRow(Base):
    __tablename__ = "locks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    boot_id: Mapped[str] = mapped_column(CompactUuid(64))  # 16 bytes on SQLite from 0018 on
    command: Mapped[str] = mapped_column(String(64))
    tx_id: Mapped[str | None] = mapped_column(String(36))
    since: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class LockRelease(Base):
    __tablename__ = "lock_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    lock_id: Mapped[str] = mapped_column(ForeignKey("locks.id"), unique=True)
    how: Mapped[str] = mapped_column(String(16))
    by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class AuditEntry(Base):
    """Hash-chained journal: hash = SHA-256(previous entry's hash | canonical entry); see
    persistence.audit.

    `rows_json` lists the history rows this entry covers, each as [table, key, digest].
    `prev_hash` holds the previous entry's whole hash in entries written before migration
    0010, and its first `audit.LINK_TAG` hex digits after it (the hash itself still
    chains the whole one); on SQLite `hash` is stored as 32 bytes and `rows_json` packed
    (`rowrefs`) in those entries, and from migration 0011 on `at` as 8 bytes and `tx_id`
    as 16 (`coltypes`). No index but the id's: nothing looks an entry up by its
    transaction or hash (0010 dropped both; an edited copy of a hash is caught by the walk).
    """

    __tablename__ = "audit_journal"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[str] = mapped_column(CompactTime(32))
    tx_id: Mapped[str | None] = mapped_column(CompactUuid(36))
    event: Mapped[str] = mapped_column(String(64))
    payload_json: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(LinkTag(64))  # 4 bytes on SQLite from 0018 on
    hash: Mapped[str] = mapped_column(HexDigest(64))
    rows_json: Mapped[str] = mapped_column(PackedRows, default="[]", server_default="[]")
    host_id: Mapped[int | None] = host_column()


class GpuOwnershipEvent(Base):
    """A claim or release of a GPU role; the latest event per role says who owns it now."""

    __tablename__ = "gpu_ownership_events"
    __table_args__ = (Index("ix_gpu_ownership_role_id", "role", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(16))
    container_id: Mapped[str] = mapped_column(HexDigest(64))  # 32 bytes on SQLite from 0014 on
    tx_id: Mapped[str | None] = mapped_column(CompactUuid(36))  # 16 bytes on SQLite from 0014 on
    mode: Mapped[GpuMode] = mapped_column(String(16))
    slot: Mapped[str] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class EvidenceRow(Base):
    """One gate's result and its artifact's hash; never rewritten."""

    __tablename__ = "evidence"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    gate: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    passed: Mapped[int] = mapped_column(Integer)
    classification: Mapped[str] = mapped_column(String(64), default="")
    artifact_path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class DecisionRow(Base):
    """A decision bound to a candidate identity; a reclassification is a new row pointing back."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_identity_digest_at", "identity_digest", "at", "id"),
        Index("ix_decisions_at", "at"),  # the newest decisions (`audit decisions --limit`; 0021)
        # what reclassifies a decision (0021): reclassifications only, raw decisions cost nothing
        partial_index("ix_decisions_reclassifies", "reclassifies", where="reclassifies IS NOT NULL"),
        partial_index("ix_decisions_waived", "id", where="waiver_ids_json <> '[]'"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    slot: Mapped[str] = mapped_column(String(64))
    identity_digest: Mapped[str] = mapped_column(String(64))  # ix_decisions_identity_digest_at
    container_id: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))
    profile: Mapped[str] = mapped_column(String(64), default="")
    manifest_sha256: Mapped[str] = mapped_column(String(64), default="")
    reclassifies: Mapped[str | None] = mapped_column(ForeignKey("decisions.id"))
    waiver_ids_json: Mapped[str] = mapped_column(Text, default="[]")
    reasons_json: Mapped[str] = mapped_column(Text, default="[]")
    body_json: Mapped[str] = mapped_column(Text, default="{}")
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class WaiverRow(Base):
    """An attributed, scoped, expiring change of one policy value."""

    __tablename__ = "waivers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    policy: Mapped[str] = mapped_column(String(32))
    roles_json: Mapped[str] = mapped_column(Text, default="[]")
    recipe_digest: Mapped[str | None] = mapped_column(String(64))
    value: Mapped[int] = mapped_column(Integer)
    approved_by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[str | None] = mapped_column(String(32))
    gates_json: Mapped[str | None] = mapped_column(Text)
    """A gate waiver's gates (JSON list); NULL when it names none, so that waivers recorded
    before the column existed keep their audit digest (migration 0008)."""
    host_id: Mapped[int | None] = host_column()


class WaiverRevocation(Base):
    __tablename__ = "waiver_revocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    waiver_id: Mapped[str] = mapped_column(ForeignKey("waivers.id"), unique=True)
    by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class ApprovalRow(Base):
    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_decision_id", "decision_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"))
    approved_by: Mapped[str] = mapped_column(String(255))
    at: Mapped[str] = mapped_column(CompactTime(32))
    host_id: Mapped[int | None] = host_column()


class RecheckRow(Base):
    """One recheck run. Read newest first per host (`audit rechecks`, `fleet status`) through
    `ix_rechecks_host_key_id` (0020): a host's newest runs are a search, whatever the other
    hosts of the database ran since. Its assertions (what each observed: most of a run's
    bytes, written every cron interval) are `PackedJSON` from 0020 on."""

    __tablename__ = "rechecks"
    __table_args__ = (Index("ix_rechecks_host_key_id", text(HOST_KEY_SQL), "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    slot: Mapped[str] = mapped_column(String(64), index=True)
    passed: Mapped[int] = mapped_column(Integer)
    failed_json: Mapped[str] = mapped_column(Text)
    assertions_json: Mapped[str] = mapped_column(PackedJSON)  # packed on SQLite from 0020 on
    snapshot_sha256: Mapped[str] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(String(32), index=True)
    host_id: Mapped[int | None] = host_column()


APPEND_ONLY_TABLES_0002 = (
    "gpu_ownership_events",
    "evidence",
    "decisions",
    "waivers",
    "waiver_revocations",
    "approvals",
    "rechecks",
)

APPEND_ONLY_TABLES = (
    "transactions",
    "transaction_states",
    "step_events",
    "snapshots",
    "snapshot_diffs",
    "identities",
    "locks",
    "lock_releases",
    "audit_journal",
)


APPEND_ONLY_TABLES_0004 = ("shm_marks",)

APPEND_ONLY_TABLES_0005 = ("evidence_manifests", "audit_checkpoints")

APPEND_ONLY_TABLES_0007 = ("snapshot_blobs",)

APPEND_ONLY_TABLES_0009 = ("hosts",)

HOST_TABLES: tuple[str, ...] = (
    *APPEND_ONLY_TABLES,
    *APPEND_ONLY_TABLES_0002,
    *APPEND_ONLY_TABLES_0004,
    *APPEND_ONLY_TABLES_0005,
)
"""The history tables whose rows carry `host_id` (the journal included). Not `snapshot_blobs`:
a body is stored once per content, whichever host recorded it; not `identity_bodies` (migration
0010: an identity's body once per content, likewise); not `hosts` itself."""

APPEND_ONLY_TABLES_0010 = ("identity_bodies",)

# Every table whose rows are history: append-only, and each row covered by the audit chain.
# The journal itself is append-only too, but it is the chain, not a row it covers.
HISTORY_TABLES: tuple[str, ...] = tuple(
    t
    for t in (
        *APPEND_ONLY_TABLES,
        *APPEND_ONLY_TABLES_0002,
        *APPEND_ONLY_TABLES_0004,
        *APPEND_ONLY_TABLES_0005,
        *APPEND_ONLY_TABLES_0007,
        *APPEND_ONLY_TABLES_0009,
        *APPEND_ONLY_TABLES_0010,
    )
    if t != AuditEntry.__tablename__
)


# The projection's tables live in `current_models`; imported here so that `Base.metadata`
# always holds them and `models` stays the one place to import any table from.
from anvil_ctl.persistence.current_models import (  # noqa: E402
    PROJECTION_TABLES,
    GpuOwnerCurrent,
    IdentityCurrent,
    LockHeld,
    ServingInterval,
    TxCurrent,
)

__all__ = [
    "FIRST_HOST_ID",
    "PROJECTION_TABLES",
    "AuditCheckpoint",
    "Base",
    "EvidenceManifestRow",
    "GpuOwnerCurrent",
    "Host",
    "IdentityCurrent",
    "LockHeld",
    "ServingInterval",
    "ShmMarkRow",
    "TxCurrent",
]
