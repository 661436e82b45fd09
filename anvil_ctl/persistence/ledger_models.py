"""History tables of the ledgers the chain also covers: evidence manifests, verify
checkpoints (migration 0005) and the shared-memory marks (migration 0004). Import them
from `models`, which re-exports them.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from anvil_ctl.persistence.base import Base, host_column


class EvidenceManifestRow(Base):
    """The SHA-256 of an evidence manifest as written: a qualify run's, or an export's."""

    __tablename__ = "evidence_manifests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(String(36), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    source_sha256: Mapped[str | None] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class AuditCheckpoint(Base):
    """A chain position `audit verify` found intact, and what the covered tables held then.

    Incremental verification starts from the latest one: entry `seq` must still have
    `hash`, and each covered table must hold its `counts_json` count plus what the
    entries after `seq` cover.
    """

    __tablename__ = "audit_checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    schema_version: Mapped[int | None] = mapped_column(Integer)
    counts_json: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(16))
    entries_checked: Mapped[int] = mapped_column(Integer)
    rows_checked: Mapped[int] = mapped_column(Integer)
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()


class ShmMarkRow(Base):
    """A shared-memory file a process of a managed container was seen holding (the shm ledger).

    Written once per (boot, path, inode); read back so that a file left after its
    container stopped is still known as ours. See `anvil_ctl.persistence.shm_ledger`.
    """

    __tablename__ = "shm_marks"
    __table_args__ = (Index("ix_shm_marks_boot_id_path", "boot_id", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    boot_id: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    dev: Mapped[int] = mapped_column(BigInteger)
    ino: Mapped[int] = mapped_column(BigInteger)
    container_id: Mapped[str] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[int | None] = host_column()
