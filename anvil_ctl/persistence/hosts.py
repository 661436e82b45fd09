"""The fleet's hosts: each host name registered once, bound to the machine that claimed it,
and what each is doing (`anvilctl fleet status`).

The first write for a host name registers it; every later command checks the machine is the
one recorded (`HostClaimed`, exit 8), so two machines cannot silently write as one host.
"""

from __future__ import annotations

from sqlalchemy import func, select, text

from anvil_ctl.core.errors import HostClaimed
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence import audit, projection
from anvil_ctl.persistence.current_models import IdentityCurrent, LockHeld
from anvil_ctl.persistence.models import FIRST_HOST_ID, Host, IdentityRow, RecheckRow
from anvil_ctl.persistence.store import Store, utcnow


def all_hosts(store: Store) -> list[Host]:
    """Every registered host, in registration order."""
    with store.read() as s:
        return list(s.execute(select(Host).order_by(Host.id)).scalars())


def by_name(store: Store, name: str) -> Host | None:
    with store.read() as s:
        return s.execute(select(Host).where(Host.name == name)).scalar()


def attach(store: Store, name: str, *, machine_id: str, boot_id: str) -> Host | None:
    """This process's host, checked against the machine recorded for its name (`HostClaimed`).
    An unknown name is registered by this host's first write (a read-only command writes nothing).
    Sets `store.host_id` and `store.host_name`; returns the record, None while unregistered."""
    found = by_name(store, name)
    store.host_name = name
    if found is None:
        store.unregistered = True
        store.on_first_write = lambda: _settle(
            store, _register(store, name, machine_id=machine_id, boot_id=boot_id), machine_id
        )
        return None
    _settle(store, found, machine_id)
    return found


def _settle(store: Store, found: Host, machine_id: str) -> None:
    """Attach `store` to host `found`, refused when it is recorded for another machine."""
    if found.machine_id != machine_id:
        raise HostClaimed(
            f"host {found.name!r} is recorded for machine {found.machine_id} (registered "
            f"{found.registered_at}), but this machine is {machine_id}: two machines cannot be one "
            "host; give this one its own name in anvil.toml ([host] name)",
            host=found.name,
            recorded_machine_id=found.machine_id,
            machine_id=machine_id,
        )
    store.host_id, store.host_name, store.unregistered = found.id, found.name, False


def _register(store: Store, name: str, *, machine_id: str, boot_id: str) -> Host:
    with store.write() as s:
        if s.get_bind().dialect.name == "postgresql":
            # the chain's lock: registrations (and every append) one at a time, so two new
            # hosts never take the same id
            s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": audit.AUDIT_LOCK_KEY})
        row = s.execute(select(Host).where(Host.name == name)).scalar()
        if row is not None:  # registered since we looked
            return row
        last = s.execute(select(func.max(Host.id))).scalar()
        row = Host(
            id=FIRST_HOST_ID if last is None else last + 1,
            name=name,
            machine_id=machine_id,
            boot_id=boot_id,
            registered_at=utcnow(),
        )
        s.add(row)
        s.flush()
        s.info[audit.HOST] = row.id
        store.audit(s, "host.registered", None, {"host": name, "machine_id": machine_id})
        return row


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
                    "last_recheck": {**recheck._mapping, "passed": bool(recheck.passed)} if recheck else None,
                    "open_transactions": [
                        {k: getattr(t, k) for k in ("tx_id", "kind", "slot", "state", "created_at")}
                        for t in open_txs
                    ],
                    "locks_held": len(locks),
                }
            )
    return out
