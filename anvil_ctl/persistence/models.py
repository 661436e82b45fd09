"""ORM models of the state database's history (the projection's are in `current_models`).

History tables derive from `History`: append-only (triggers in `ddl`) and covered row by row by
the audit chain. Timestamps are ISO-8601 UTC text; JSON is canonical text so its hashes are
stable, and large bodies (`Compressed`) are stored deflated.
"""

from __future__ import annotations

import zlib
from typing import Literal

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

GpuMode = Literal["exclusive", "split"]
"""How a serve owns its GPU roles (`anvil_ctl.gpu.ownership.Mode`; only these are written)."""


class Base(DeclarativeBase):
    pass


class History:
    """An append-only table whose every row the audit chain covers (see the module doc)."""


class HostHistory(History):
    """History written by one host of the fleet: every row names it."""

    host_id: Mapped[int] = mapped_column(SmallInteger, ForeignKey("hosts.id"))


class Appended:
    """A row keyed by the order rows are appended in, stamped with the time it was."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, sort_order=-1)
    at: Mapped[str] = mapped_column(String(32))


class Compressed(TypeDecorator[str]):
    """Canonical JSON text stored deflated (zlib); readers and digests see the text. A value that
    is not a zlib stream of text reads as `UNREADABLE`, which no digest covers."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else zlib.compress(value.encode(), 9)

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None:
            return None
        try:
            return zlib.decompress(value).decode()  # type: ignore[arg-type]
        except (TypeError, zlib.error, UnicodeDecodeError):
            return UNREADABLE


UNREADABLE = "\x00 not a compressed JSON body"


_POSTGRESQL_WHERE = "anvil_postgresql_where"


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index over the rows for which `where` holds, on SQLite and on PostgreSQL.

    The PostgreSQL `WHERE` waits in `info` for `add_postgresql_options`: naming that dialect's
    option here would load it for every command on SQLite.
    """
    return Index(name, *columns, sqlite_where=text(where), info={_POSTGRESQL_WHERE: where})


def add_postgresql_options(metadata: MetaData) -> None:
    """Give every `partial_index` of `metadata` its PostgreSQL `WHERE` (idempotent)."""
    for table in metadata.tables.values():
        for index in table.indexes:
            where = index.info.get(_POSTGRESQL_WHERE)
            if where is not None and index.dialect_options["postgresql"]["where"] is None:
                index.dialect_options["postgresql"]["where"] = text(where)


class Host(History, Base):
    """A host of the fleet: its name (anvil.toml `[host] name`) and the machine that claimed it,
    registered once, never changed (a second machine claiming the name is refused)."""

    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    machine_id: Mapped[str] = mapped_column(String(64))
    boot_id: Mapped[str] = mapped_column(String(64))
    registered_at: Mapped[str] = mapped_column(String(32))


FIRST_HOST_ID = 1
"""The id the first host registered in a database gets."""


class Transaction(HostHistory, Base):
    __tablename__ = "transactions"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # no index: views filter tx_current
    slot: Mapped[str | None] = mapped_column(String(64))
    args_json: Mapped[str] = mapped_column(Compressed)
    owner_pid: Mapped[int] = mapped_column(Integer)
    owner_host: Mapped[str] = mapped_column(String(255))
    owner_boot_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32), index=True)


class TransactionState(Appended, HostHistory, Base):
    __tablename__ = "transaction_states"
    __table_args__ = (Index("ix_transaction_states_tx_id_id", "tx_id", "id"),)

    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"))
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    data_json: Mapped[str] = mapped_column(Text, default="{}")


class StepEventRow(Appended, HostHistory, Base):
    """A step's intent or result."""

    __tablename__ = "step_events"
    __table_args__ = (Index("ix_step_events_tx_id_id", "tx_id", "id"),)

    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"))
    seq: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(64))
    phase: Mapped[str] = mapped_column(String(8))
    event: Mapped[str] = mapped_column(String(16))
    detail_json: Mapped[str] = mapped_column(Compressed, default="{}")


class SnapshotRow(Appended, HostHistory, Base):
    """A snapshot taken: its body is the `snapshot_blobs` row of its `sha256`."""

    __tablename__ = "snapshots"

    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    label: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))


class SnapshotBlob(History, Base):
    """A snapshot's canonical body, stored once per distinct content (keyed by its SHA-256),
    whichever host recorded it."""

    __tablename__ = "snapshot_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    body_json: Mapped[str] = mapped_column(Compressed)
    at: Mapped[str] = mapped_column(String(32))


class SnapshotDiff(Appended, HostHistory, Base):
    """Two snapshots' difference as a JSON Patch (RFC 6902) with a `test` of every value it
    takes away."""

    __tablename__ = "snapshot_diffs"

    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    label: Mapped[str] = mapped_column(String(32))
    before_sha256: Mapped[str] = mapped_column(String(64))
    after_sha256: Mapped[str] = mapped_column(String(64))
    equal: Mapped[int] = mapped_column(Integer)
    changes_json: Mapped[str] = mapped_column(Compressed)


class IdentityRow(Appended, HostHistory, Base):
    """A serve's identity as observed at one moment; the latest row per (slot, role) is current.
    Its body is the `identity_bodies` row of its `digest` (the SHA-256 of the body)."""

    __tablename__ = "identities"
    __table_args__ = (Index("ix_identities_slot_role_id", "slot", "role", "id"),)

    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    slot: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))
    container_id: Mapped[str] = mapped_column(String(64))
    image_id: Mapped[str] = mapped_column(String(80))
    served_model: Mapped[str] = mapped_column(String(255))


class IdentityBody(History, Base):
    """An identity's canonical body, stored once per distinct content (keyed by its SHA-256,
    the identity's `digest`), whichever host recorded it."""

    __tablename__ = "identity_bodies"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    body_json: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(String(32))


class LockRow(HostHistory, Base):
    __tablename__ = "locks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    boot_id: Mapped[str] = mapped_column(String(64))
    command: Mapped[str] = mapped_column(String(64))
    tx_id: Mapped[str | None] = mapped_column(String(36))
    since: Mapped[str] = mapped_column(String(32))


class LockRelease(Appended, HostHistory, Base):
    __tablename__ = "lock_releases"

    lock_id: Mapped[str] = mapped_column(ForeignKey("locks.id"), unique=True)
    how: Mapped[str] = mapped_column(String(16))
    by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")


class AuditEntry(Appended, Base):
    """Hash-chained journal entry (see `audit`): append-only, the chain itself rather than a row
    it covers. `rows_json` lists the covered rows as [table, key, digest]."""

    __tablename__ = "audit_journal"

    tx_id: Mapped[str | None] = mapped_column(String(36))
    event: Mapped[str] = mapped_column(String(64))
    payload_json: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    rows_json: Mapped[str] = mapped_column(Text, default="[]", server_default="[]")
    host_id: Mapped[int] = mapped_column(SmallInteger, ForeignKey("hosts.id"))


class GpuOwnershipEvent(Appended, HostHistory, Base):
    """A claim or release of a GPU role; the latest event per role says who owns it now."""

    __tablename__ = "gpu_ownership_events"
    __table_args__ = (Index("ix_gpu_ownership_role_id", "role", "id"),)

    role: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(16))
    container_id: Mapped[str] = mapped_column(String(64))
    tx_id: Mapped[str | None] = mapped_column(String(36))
    mode: Mapped[GpuMode] = mapped_column(String(16))
    slot: Mapped[str] = mapped_column(String(64))


class EvidenceRow(Appended, HostHistory, Base):
    """One gate's result and its artifact's hash; never rewritten."""

    __tablename__ = "evidence"

    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    gate: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    passed: Mapped[int] = mapped_column(Integer)
    classification: Mapped[str] = mapped_column(String(64), default="")
    artifact_path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)


class DecisionRow(HostHistory, Base):
    """A decision bound to a candidate identity; a reclassification is a new row pointing back."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_identity_digest_at", "identity_digest", "at", "id"),
        Index("ix_decisions_at", "at"),  # the newest decisions (`audit decisions --limit`)
        # what reclassifies a decision: reclassifications only, raw decisions cost nothing
        partial_index("ix_decisions_reclassifies", "reclassifies", where="reclassifies IS NOT NULL"),
        partial_index("ix_decisions_waived", "id", where="waiver_ids_json <> '[]'"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tx_id: Mapped[str | None] = mapped_column(ForeignKey("transactions.id"), index=True)
    slot: Mapped[str] = mapped_column(String(64))
    identity_digest: Mapped[str] = mapped_column(String(64))
    container_id: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))
    profile: Mapped[str] = mapped_column(String(64), default="")
    manifest_sha256: Mapped[str] = mapped_column(String(64), default="")
    reclassifies: Mapped[str | None] = mapped_column(ForeignKey("decisions.id"))
    waiver_ids_json: Mapped[str] = mapped_column(Text, default="[]")
    reasons_json: Mapped[str] = mapped_column(Text, default="[]")
    body_json: Mapped[str] = mapped_column(Text, default="{}")
    at: Mapped[str] = mapped_column(String(32))


class WaiverRow(HostHistory, Base):
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
    """A gate waiver's gates (JSON list); NULL when it names none."""


class WaiverRevocation(Appended, HostHistory, Base):
    __tablename__ = "waiver_revocations"

    waiver_id: Mapped[str] = mapped_column(ForeignKey("waivers.id"), unique=True)
    by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)


class ApprovalRow(Appended, HostHistory, Base):
    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_decision_id", "decision_id"),)

    tx_id: Mapped[str] = mapped_column(ForeignKey("transactions.id"), index=True)
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"))
    approved_by: Mapped[str] = mapped_column(String(255))


class RecheckRow(Appended, HostHistory, Base):
    """One recheck run, read newest first per host (`audit rechecks`, `fleet status`) through
    `ix_rechecks_host_id_id`: a search, whatever other hosts ran since."""

    __tablename__ = "rechecks"
    __table_args__ = (Index("ix_rechecks_host_id_id", "host_id", "id"),)

    slot: Mapped[str] = mapped_column(String(64), index=True)
    passed: Mapped[int] = mapped_column(Integer)
    failed_json: Mapped[str] = mapped_column(Text)
    assertions_json: Mapped[str] = mapped_column(Compressed)
    snapshot_sha256: Mapped[str] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(String(32), index=True)


class EvidenceManifestRow(Appended, HostHistory, Base):
    """The SHA-256 of an evidence manifest as written: a qualify run's, or an export's."""

    __tablename__ = "evidence_manifests"

    tx_id: Mapped[str] = mapped_column(String(36), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    source_sha256: Mapped[str | None] = mapped_column(String(64))


class AuditCheckpoint(Appended, HostHistory, Base):
    """A chain position `audit verify` found intact, and each covered table's row count then;
    incremental verification starts from the latest one."""

    __tablename__ = "audit_checkpoints"

    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    schema_version: Mapped[int | None] = mapped_column(Integer)
    counts_json: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(16))
    entries_checked: Mapped[int] = mapped_column(Integer)
    rows_checked: Mapped[int] = mapped_column(Integer)


class ShmMarkRow(Appended, HostHistory, Base):
    """A shared-memory file a managed container's process was seen holding, once per (boot, path,
    inode), so a file left after its container stopped is still known as ours."""

    __tablename__ = "shm_marks"
    __table_args__ = (Index("ix_shm_marks_boot_id_path", "boot_id", "path"),)

    boot_id: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    dev: Mapped[int] = mapped_column(BigInteger)
    ino: Mapped[int] = mapped_column(BigInteger)
    container_id: Mapped[str] = mapped_column(String(64))


_MODELS = {m.class_.__tablename__: m.class_ for m in Base.registry.mappers}

HISTORY_TABLES: tuple[str, ...] = tuple(
    t.name for t in Base.metadata.sorted_tables if issubclass(_MODELS[t.name], History)
)
"""Every history table, parents before the tables that refer to them."""

APPEND_ONLY_TABLES: tuple[str, ...] = (*HISTORY_TABLES, AuditEntry.__tablename__)
"""The tables whose triggers refuse rewrites: history and the journal."""
