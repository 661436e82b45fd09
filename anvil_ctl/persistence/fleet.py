"""What every host of a fleet sharing one state database is doing (`anvilctl fleet status`),
and the serving history across hosts; reads only."""

from __future__ import annotations

from sqlalchemy import select, text

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.current_models import IdentityCurrent, LockHeld
from anvil_ctl.persistence.models import Host, IdentityRow, RecheckRow
from anvil_ctl.persistence.queries import equal_to
from anvil_ctl.persistence.store import Store


def status(store: Store) -> list[JSONObject]:
    """Every registered host, in registration order: its name, machine, incumbents (slot,
    incumbent, served_model, since), last recheck, unresolved transactions and held locks."""
    out: list[JSONObject] = []
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
                    "slots": [dict(r._mapping) for r in slots],
                    "last_recheck": (
                        {"slot": recheck.slot, "passed": bool(recheck.passed), "at": recheck.at}
                        if recheck is not None
                        else None
                    ),
                    "open_transactions": [
                        {k: getattr(t, k) for k in ("tx_id", "kind", "slot", "state", "created_at")}
                        for t in open_txs
                    ],
                    "locks_held": len(locks),
                }
            )
    return out


def served_at(store: Store, *, slot: str, at: str, host: int | None) -> list[JSONObject]:
    """Which container served `slot` at time `at` (one per host; of host `host`, or of every
    host when None), from the serving history (`v_serving_history`, the projection's)."""
    sql = (
        "SELECT host, slot, container_id, served_model, served_from, served_until, tx_id "
        "FROM v_serving_history WHERE served_from <= :at AND (served_until IS NULL OR served_until > :at)"
    )
    where, params = equal_to(slot=slot, host_id=host)
    sql += where + " ORDER BY host_id, served_from"
    params["at"] = at
    with store.read() as s:
        return [dict(r._mapping) for r in s.execute(text(sql), params)]
