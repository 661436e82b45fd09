"""ORM models of the current-state projection: derived, mutable, not covered by the chain.

Each row is written in the same database transaction as the history row it summarizes;
`projection.rebuild` derives the same rows from history alone. Keys begin with the host.
"""

from __future__ import annotations

from sqlalchemy import Index, Integer, SmallInteger, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from anvil_ctl.persistence.models import Base, GpuMode, partial_index


class TxCurrent(Base):
    """One row per transaction: its latest state (`state_id`: that `transaction_states` row)."""

    __tablename__ = "tx_current"
    __table_args__ = (
        Index("ix_tx_current_state", "state"),
        Index("ix_tx_current_created_at", "created_at"),
        Index("ix_tx_current_kind_created_at", "kind", "created_at"),
        Index("ix_tx_current_slot_created_at", "slot", "created_at"),
        Index("ix_tx_current_host_created_at", "host_id", "created_at"),
        # The few transactions not resolved (what every mutation's guard asks for), whatever
        # the planner's statistics say about `state`.
        partial_index("ix_tx_current_unresolved", "created_at", where="unresolved = 1"),
        # A slot's revisions by number: its newest, one by number, how many.
        partial_index("ix_tx_current_revision", "host_id", "slot", "revision", where="revision IS NOT NULL"),
    )

    tx_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    host_id: Mapped[int] = mapped_column(SmallInteger)
    kind: Mapped[str] = mapped_column(String(32))
    slot: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    state_id: Mapped[int] = mapped_column(Integer)
    unresolved: Mapped[int] = mapped_column(Integer)  # 1: state in core.states.UNRESOLVED_STATES
    owner_pid: Mapped[int] = mapped_column(Integer)
    owner_host: Mapped[str] = mapped_column(String(255))
    owner_boot_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[str] = mapped_column(String(32))
    revision: Mapped[int | None] = mapped_column(Integer)
    """Its number among its slot's revisions (`projection.REVISION_KINDS` that ran), from 1 in
    the order they began; None for any other transaction."""


class IdentityCurrent(Base):
    """One row per (slot, role): the latest identity recorded (`identity_id`), e.g. the incumbent."""

    __tablename__ = "identity_current"

    host_id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    slot: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16), primary_key=True)
    identity_id: Mapped[int] = mapped_column(Integer)
    container_id: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(64))
    at: Mapped[str] = mapped_column(String(32))


class ServingInterval(Base):
    """One row per incumbent recorded by a committed transaction: who served a slot, from
    `served_from` (its identity's time) until the next such incumbent's (None: still)."""

    __tablename__ = "serving_intervals"
    __table_args__ = (
        Index("ix_serving_intervals_slot_from", "slot", "served_from"),
        Index("ix_serving_intervals_host_slot_from", "host_id", "slot", "served_from"),
        Index("ix_serving_intervals_from", "served_from"),
        Index("ix_serving_intervals_tx_id", "tx_id"),
    )

    identity_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    host_id: Mapped[int] = mapped_column(SmallInteger)
    slot: Mapped[str] = mapped_column(String(64))
    tx_id: Mapped[str] = mapped_column(String(36))
    served_from: Mapped[str] = mapped_column(String(32))
    served_until: Mapped[str | None] = mapped_column(String(32))


class GpuOwnerCurrent(Base):
    """One row per GPU role that is claimed now (the latest ledger event is a claim)."""

    __tablename__ = "gpu_owner_current"

    host_id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    role: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_id: Mapped[int] = mapped_column(Integer)
    container_id: Mapped[str] = mapped_column(String(64))
    tx_id: Mapped[str | None] = mapped_column(String(36))
    mode: Mapped[GpuMode] = mapped_column(String(16))
    slot: Mapped[str] = mapped_column(String(64))
    since: Mapped[str] = mapped_column(String(32))


class LockHeld(Base):
    """One row per lock row without a release row (held, or left by an owner that died)."""

    __tablename__ = "lock_held"
    __table_args__ = (
        Index("ix_lock_held_host_since", "host", "since"),
        Index("ix_lock_held_since", "since"),
        Index("ix_lock_held_host_id_since", "host_id", "since"),
    )

    lock_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    host_id: Mapped[int] = mapped_column(SmallInteger)
    host: Mapped[str] = mapped_column(String(255))
    since: Mapped[str] = mapped_column(String(32))


PROJECTION_MODELS: dict[str, type[Base]] = {
    m.__tablename__: m for m in (TxCurrent, IdentityCurrent, ServingInterval, GpuOwnerCurrent, LockHeld)
}
"""Derived from history, rebuilt from it, mutable: deliberately not covered by the chain."""
PROJECTION_TABLES = tuple(PROJECTION_MODELS)
