"""What every host of a fleet sharing one state database is doing (`anvilctl fleet status`),
and the serving history across hosts; reads only."""

from __future__ import annotations

from typing import TypedDict, cast

from sqlalchemy import select, text

from anvil_ctl.persistence import projection
from anvil_ctl.persistence.current_models import IdentityCurrent, LockHeld
from anvil_ctl.persistence.models import Host, IdentityRow, RecheckRow
from anvil_ctl.persistence.store import Store


class SlotStatus(TypedDict):
    slot: str
    incumbent: str
    served_model: str
    since: str


class RecheckStatus(TypedDict):
    slot: str
    passed: bool
    at: str


class OpenTransaction(TypedDict):
    tx_id: str
    kind: str
    slot: str | None
    state: str
    created_at: str


class HostStatus(TypedDict):
    host: str
    host_id: int
    machine_id: str
    registered_at: str
    this_host: bool
    slots: list[SlotStatus]
    last_recheck: RecheckStatus | None
    open_transactions: list[OpenTransaction]
    locks_held: int


def status(store: Store) -> list[HostStatus]:
    """Every registered host, in registration order (see the module doc)."""
    out: list[HostStatus] = []
    with store.read() as s:
        for h in s.execute(select(Host).order_by(Host.id)).scalars():
            slots = s.execute(
                select(
                    IdentityCurrent.slot,
                    IdentityCurrent.container_id.label("incumbent"),
                    IdentityRow.served_model,
                    IdentityCurrent.at.label("since"),
                )
                .join(IdentityRow, IdentityRow.id == IdentityCurrent.identity_id)
                .where(IdentityCurrent.host_id == h.id, IdentityCurrent.role == "incumbent")
                .order_by(IdentityCurrent.slot)
            ).all()
            recheck = s.execute(
                select(RecheckRow.slot, RecheckRow.passed, RecheckRow.at)
                .where(RecheckRow.host_id == h.id)  # ix_rechecks_host_id_id
                .order_by(RecheckRow.id.desc())
                .limit(1)
            ).first()
            # through the projection's partial index (a bound `unresolved = ?` cannot use it)
            open_txs = projection.tx_rows_in(s, frozenset(projection.UNRESOLVED), host=h.id)
            locks = s.execute(select(LockHeld.lock_id).where(LockHeld.host_id == h.id)).all()
            out.append(
                {
                    "host": h.name,
                    "host_id": h.id,
                    "machine_id": h.machine_id,
                    "registered_at": h.registered_at,
                    "this_host": h.id == store.host,
                    "slots": [cast(SlotStatus, dict(r._mapping)) for r in slots],
                    "last_recheck": (
                        {"slot": recheck.slot, "passed": bool(recheck.passed), "at": recheck.at}
                        if recheck is not None
                        else None
                    ),
                    "open_transactions": [
                        {
                            "tx_id": t.tx_id,
                            "kind": t.kind,
                            "slot": t.slot,
                            "state": t.state,
                            "created_at": t.created_at,
                        }
                        for t in open_txs
                    ],
                    "locks_held": len(locks),
                }
            )
    return out


class Served(TypedDict):
    """A row of `v_serving_history`: who served a slot on a host, from when until when."""

    host: str
    slot: str
    container_id: str
    served_model: str
    served_from: str
    served_until: str | None
    tx_id: str


def served_at(store: Store, *, slot: str, at: str, host: int | None) -> list[Served]:
    """Which container served `slot` at time `at` (one per host; of host `host`, or of every
    host when None), from the serving history (`v_serving_history`, the projection's)."""
    sql = (
        "SELECT host, slot, container_id, served_model, served_from, served_until, tx_id "
        "FROM v_serving_history WHERE slot = :slot AND served_from <= :at "
        "AND (served_until IS NULL OR served_until > :at)"
    )
    params: dict[str, str | int] = {"slot": slot, "at": at}
    if host is not None:
        sql += " AND host_id = :host"
        params["host"] = host
    sql += " ORDER BY host_id, served_from"
    with store.read() as s:
        return [cast(Served, dict(r._mapping)) for r in s.execute(text(sql), params)]
