"""Read-only audit queries for `anvilctl audit`: transactions, their journal, diffs, identities,
the serving history.

Each returns JSON-able dicts (the TypedDicts below); the listings go through the operator views
(`v_transactions`, `v_identities`), so they answer what an operator's own `sqlite3` query would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypedDict, cast

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    and_,
    bindparam,
    func,
    select,
    text,
)
from sqlalchemy.orm import Session

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.snapshot import from_patch
from anvil_ctl.persistence.models import (
    Base,
    Host,
    IdentityRow,
    SnapshotDiff,
    SnapshotRow,
    StepEventRow,
    Transaction,
    TransactionState,
)
from anvil_ctl.persistence.projection import newest_revision
from anvil_ctl.persistence.store import Store


class TransactionSummary(TypedDict):
    """A row of `v_transactions`: a transaction with its current state, and its host."""

    tx_id: str
    host: str | None
    kind: str
    slot: str | None
    state: str
    reason: str
    created_at: str
    updated_at: str


class TransactionDetail(TypedDict):
    """One transaction with its journal, in order (`audit show`)."""

    tx_id: str
    kind: str
    slot: str | None
    created_at: str
    host: str | None  # the fleet host that ran it (None: no host registered yet)
    owner: JSONObject  # pid, host (the owner's host name as the transaction recorded it)
    args: JSONObject
    states: list[JSONObject]  # state, reason, at, data
    steps: list[JSONObject]  # seq, step, phase, event, at, detail
    snapshots: list[JSONObject]  # label, sha256, at
    identities: list[JSONObject]  # role, container_id, served_model, digest


class ServeRef(TypedDict):
    """The serve a committed revision left."""

    container_id: str
    served_model: str
    identity_digest: str
    role: str


class Revision(TypedDict):
    """One revision of a slot (`slot_revisions`)."""

    revision: int
    tx_id: str
    kind: str
    state: str
    reason: str
    created_at: str
    updated_at: str
    serve: ServeRef | None


def equal_to(**filters: str | int | None) -> tuple[str, dict[str, str | int]]:
    """` AND column = :column` for each filter given (not None), and their parameters."""
    given = {column: value for column, value in filters.items() if value is not None}
    return "".join(f" AND {column} = :{column}" for column in given), given


def transactions(
    store: Store,
    *,
    kind: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 50,
    host: int | None = None,
) -> list[TransactionSummary]:
    """The newest `limit` transactions (with their current state), filtered by the given fields:
    of host `host`, or of every host when None."""
    sql = (
        "SELECT tx_id, host, kind, slot, state, reason, created_at, updated_at FROM v_transactions WHERE 1=1"
    )
    where, params = equal_to(host_id=host, kind=kind or None, state=state or None)
    sql += where
    params["limit"] = limit
    if since:
        sql += " AND created_at >= :since"
        params["since"] = since
    sql += " ORDER BY created_at DESC LIMIT :limit"
    with store.read() as s:
        return [cast(TransactionSummary, dict(m)) for m in s.execute(text(sql), params).mappings()]


def later_on_slot(store: Store, tx_id: str) -> list[TransactionSummary]:
    """The transactions of `tx_id`'s host and slot that began after it did, oldest first."""
    sql = (
        "SELECT v.tx_id, v.host, v.kind, v.slot, v.state, v.reason, v.created_at, v.updated_at "
        "FROM v_transactions v JOIN transactions t ON t.id = :tx "
        "WHERE v.host_id = t.host_id AND v.slot = t.slot AND v.created_at > t.created_at "
        "ORDER BY v.created_at"
    )
    with store.read() as s:
        return [cast(TransactionSummary, dict(m)) for m in s.execute(text(sql), {"tx": tx_id}).mappings()]


def state_history(store: Store, tx_id: str) -> list[tuple[str, str]]:
    """(state, reason) of every state `tx_id` has been in, in order."""
    with store.read() as s:
        q = (
            select(TransactionState.state, TransactionState.reason)
            .where(TransactionState.tx_id == tx_id)
            .order_by(TransactionState.id)
        )
        return [(str(st), str(why)) for st, why in s.execute(q)]


def _id_starts_with(s: Session, prefix: str) -> ColumnElement[bool]:
    """A transaction's ID starts with `prefix`, as a condition an index can serve: on SQLite a
    key range, not LIKE (which cannot use the BINARY primary-key index): U+FFFF sorts after
    every character an ID holds. PostgreSQL's collations may not order IDs byte-wise, so there
    it stays a prefix match. Callers keep the rows whose ID really starts with `prefix`."""
    if s.get_bind().dialect.name == "sqlite":
        return and_(Transaction.id >= prefix, Transaction.id < prefix + "\uffff")
    return Transaction.id.startswith(prefix, autoescape=True)


def transaction_ids(store: Store, prefix: str, host: int | None = None) -> list[str]:
    """IDs of the transactions whose ID starts with `prefix` (of host `host`, if given)."""
    with store.read() as s:
        q = select(Transaction.id).where(_id_starts_with(s, prefix))
        if host is not None:
            q = q.where(Transaction.host_id == host)
        return [i for i in s.execute(q).scalars() if i.startswith(prefix)]


def transaction_detail(store: Store, tx_id: str) -> TransactionDetail:
    """One transaction with its states, step events, snapshots and identities, each in order."""
    with store.read() as s:
        t = s.get(Transaction, tx_id)
        if t is None:
            raise StateStoreError(f"transaction {tx_id} not found", tx_id=tx_id)

        def rows(model: type[Base], *names: str) -> list[JSONObject]:
            """The transaction's rows of `model` in order, as `names`' columns (a `*_json` one
            parsed and named without its suffix)."""
            c = model.__table__.c
            q = select(*(c[n] for n in names)).where(c.tx_id == t.id).order_by(c.id)
            return [
                {n.removesuffix("_json"): json.loads(v) if n.endswith("_json") else v for n, v in r.items()}
                for r in s.execute(q).mappings()
            ]

        host = s.get(Host, t.host_id)
        return {
            "tx_id": t.id,
            "kind": t.kind,
            "slot": t.slot,
            "created_at": t.created_at,
            "host": host.name if host is not None else None,
            "owner": {"pid": t.owner_pid, "host": t.owner_host},
            "args": json.loads(t.args_json),
            "states": rows(TransactionState, "state", "reason", "at", "data_json"),
            "steps": rows(StepEventRow, "seq", "step", "phase", "event", "at", "detail_json"),
            "snapshots": rows(SnapshotRow, "label", "sha256", "at"),
            "identities": rows(IdentityRow, "role", "container_id", "served_model", "digest"),
        }


def snapshot_diffs(store: Store, tx_id: str) -> list[JSONObject]:
    """The before/after snapshot comparisons one transaction recorded, in order: label, equal,
    both hashes, `format` (json-patch), the changes and the stored JSON Patch."""
    with store.read() as s:
        rows = s.execute(
            select(SnapshotDiff).where(SnapshotDiff.tx_id == tx_id).order_by(SnapshotDiff.id)
        ).scalars()
        out: list[JSONObject] = []
        for r in rows:
            stored: JSONValue = json.loads(r.changes_json)
            if not isinstance(stored, list) or not all(isinstance(op, dict) for op in stored):
                raise StateStoreError(f"snapshot diff {r.id}: changes_json is not a list of objects")
            changes = from_patch([op for op in stored if isinstance(op, dict)])
            out.append(
                {
                    "label": r.label,
                    "equal": bool(r.equal),
                    "before_sha256": r.before_sha256,
                    "after_sha256": r.after_sha256,
                    "format": "json-patch",
                    "changes": [c.as_dict() for c in changes],
                    "patch": stored,
                }
            )
        return out


def identities(
    store: Store,
    *,
    slot: str | None = None,
    role: str = "incumbent",
    host: int | None = None,
    limit: int | None = None,
) -> list[JSONObject]:
    """Rows of `v_identities`: which container served (or was recorded for) each slot in
    `role`, and from when (on host `host`, or on every host when None), oldest first: every
    one, or the newest `limit` (newest first by key, through `ix_identities_slot_role_id`)."""
    sql = (
        "SELECT host, recorded_at, slot, role, container_id, image_id, served_model, digest, tx_id "
        "FROM v_identities WHERE 1=1"
    )
    where, params = equal_to(role=role, host_id=host, slot=slot or None)
    sql += where
    if limit is not None:
        sql += " ORDER BY id DESC LIMIT :limit"
        params["limit"] = limit
    else:
        sql += " ORDER BY id"
    with store.read() as s:
        rows = list(s.execute(text(sql), params))
        if limit is not None:
            rows.reverse()
        return [dict(r._mapping) for r in rows]


def slot_revisions(
    store: Store,
    slot: str,
    host: int,
    *,
    newest: int | None = None,
    number: int | None = None,
    tx_prefix: str | None = None,
) -> tuple[int, list[Revision]]:
    """How many revisions the slot has (`projection.REVISION_KINDS` that ran), and those asked
    for (all, the newest `newest`, revision `number`, or those whose transaction ID starts with
    `tx_prefix`), oldest first. Numbers come from the projection (`tx_current.revision`); a
    committed revision names the serve it left: its incumbent, else the candidate it loaded. A
    prefix's transactions are found by their key (`transaction_ids`), so a prefix naming none
    costs no walk of the slot's history."""
    ids = None if tx_prefix is None else transaction_ids(store, tx_prefix, host)
    # `revision IS NOT NULL` written out, so that SQLite may use the partial index
    sql = (
        "SELECT t.tx_id, t.kind, t.state, t.reason, t.created_at, t.updated_at, t.revision FROM tx_current t "
        "WHERE t.host_id = :host AND t.slot = :slot AND t.revision IS NOT NULL"
    )
    params: dict[str, object] = {"slot": slot, "host": host, "number": number, "ids": ids}
    with store.read() as s:
        total = newest_revision(s, host, slot)
        if ids == []:
            return total, []
        sql += " AND t.revision = :number" if number is not None else ""
        sql += " AND t.revision > :after" if newest is not None else ""
        sql += " AND t.tx_id IN :ids" if ids is not None else ""
        params["after"] = total - max(newest or 0, 0)
        q = text(f"{sql} ORDER BY t.revision")
        if ids is not None:
            q = q.bindparams(bindparam("ids", expanding=True))
        return total, _revisions(s, slot, s.execute(q, params).mappings().all())


def _revisions(s: Session, slot: str, numbered: Sequence[RowMapping]) -> list[Revision]:
    """Revision rows (`slot_revisions`'s columns) as `Revision`s, each with the serve it left."""
    serves: dict[str, dict[str, ServeRef]] = {}
    if numbered:
        rows = s.execute(
            select(IdentityRow)
            # the slot as `slot || ''`: through the slot's index SQLite read every identity of
            # the slot; by ix_identities_tx_id it reads those of these transactions only
            .where(IdentityRow.slot.concat("") == slot, IdentityRow.tx_id.in_([t["tx_id"] for t in numbered]))
            .order_by(IdentityRow.id)
        ).scalars()
        for r in rows:
            serves.setdefault(str(r.tx_id), {})[r.role] = ServeRef(
                container_id=r.container_id,
                served_model=r.served_model,
                identity_digest=r.digest,
                role=r.role,
            )
    out: list[Revision] = []
    for t in numbered:
        recorded = serves.get(t["tx_id"], {})
        serve = recorded.get("incumbent") or recorded.get("candidate")
        out.append(
            cast(
                Revision,
                {**t, "revision": int(t["revision"]), "serve": serve if t["state"] == "committed" else None},
            )
        )
    return out


def recent_ids(store: Store, what: str, prefix: str, limit: int = 100) -> list[tuple[str, str]]:
    """(ID, what it is) of recorded transactions (`what="transaction"`) or containers
    (`"container"`) whose ID starts with `prefix`, newest first: shell completion's answers."""
    with store.read() as s:
        if what == "transaction":
            q = select(Transaction.id, Transaction.kind, Transaction.slot)
            if prefix:  # by key: LIKE would read every transaction
                q = q.where(_id_starts_with(s, prefix))
            rows = s.execute(q.order_by(Transaction.created_at.desc()).limit(limit))
            return [(r.id, f"{r.kind} {r.slot or ''}".strip()) for r in rows if r.id.startswith(prefix)]
        found: dict[str, str] = {}
        matches = func.substr(IdentityRow.container_id, 1, len(prefix)) == prefix  # not a pattern
        idents = s.execute(
            select(IdentityRow.container_id, IdentityRow.served_model, IdentityRow.role, IdentityRow.slot)
            .where(matches)
            .order_by(IdentityRow.id.desc())
        )
        for r in idents:
            found.setdefault(r.container_id, f"{r.served_model} ({r.role} of {r.slot})")
            if len(found) >= limit:
                break
        return list(found.items())


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
