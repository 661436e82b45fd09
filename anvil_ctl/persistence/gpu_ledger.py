"""The GPU ownership ledger: append-only claim and release events per GPU role.

A role's owner is its latest event when that is a claim (`gpu_owner_current` in the projection).
Judging whether a start may go ahead is `anvil_ctl.gpu.ownership`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict, cast

from sqlalchemy import select

from anvil_ctl.persistence import projection
from anvil_ctl.persistence.current_models import GpuOwnerCurrent
from anvil_ctl.persistence.models import GpuMode, GpuOwnershipEvent
from anvil_ctl.persistence.store import Store, utcnow


class OwnerRecord(TypedDict):
    """Who owns a GPU role now (`gpu_owners`): the claim that is its latest event."""

    container_id: str
    tx_id: str | None
    mode: GpuMode
    slot: str
    since: str


def _append(
    store: Store, event: str, owned: Sequence[tuple[str, GpuMode, str]], container_id: str, tx_id: str | None
) -> None:
    """One event row per (role, mode, slot) of `owned`, under one audit entry."""
    with store.write() as s:
        for role, mode, slot in owned:
            row = GpuOwnershipEvent(
                role=role,
                event=event,
                container_id=container_id,
                tx_id=tx_id,
                mode=mode,
                slot=slot,
                at=utcnow(),
            )
            s.add(row)
            s.flush()
            projection.on_gpu_event(s, row)
        store.audit(s, f"gpu.{event}", tx_id, {})  # the covered event rows hold it all


def claim_roles(
    store: Store, roles: Sequence[str], *, container_id: str, tx_id: str | None, mode: GpuMode, slot: str
) -> None:
    _append(store, "claim", [(role, mode, slot) for role in roles], container_id, tx_id)


def release_roles(store: Store, roles: Sequence[str], *, container_id: str, tx_id: str | None) -> None:
    """Release the roles `container_id` owns (roles owned by another container are left alone)."""
    owners = gpu_owners(store)
    mine = [
        (r, owners[r]["mode"], owners[r]["slot"])
        for r in roles
        if r in owners and owners[r]["container_id"] == container_id
    ]
    if mine:
        _append(store, "release", mine, container_id, tx_id)


def gpu_owners(store: Store) -> dict[str, OwnerRecord]:
    """role -> {container_id, tx_id, mode, slot, since} for roles whose latest event is a claim."""
    c = GpuOwnerCurrent
    q = select(c.role, c.container_id, c.tx_id, c.mode, c.slot, c.since).where(c.host_id == store.host)
    with store.read() as s:
        rows = s.execute(q.order_by(c.role)).mappings()
        return {r["role"]: cast(OwnerRecord, {k: v for k, v in r.items() if k != "role"}) for r in rows}


def transaction_events(store: Store, tx_id: str) -> list[GpuOwnershipEvent]:
    """The ledger events one transaction wrote, in order (what its undo works from): each a
    "claim" or "release" of `role` by `container_id`."""
    q = select(GpuOwnershipEvent).where(GpuOwnershipEvent.tx_id == tx_id).order_by(GpuOwnershipEvent.id)
    with store.read() as s:
        return list(s.execute(q).scalars())
