"""The current-state projection: what is current, kept beside the history it summarizes.

The Store's writers call the `on_*` functions inside the write transaction of the history row,
so a commit carries both or neither. History stays the truth: `rebuild` derives the same rows.
"""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import bindparam, func, insert, literal_column, select, text
from sqlalchemy.orm import Session

from anvil_ctl.core.states import UNRESOLVED_STATES
from anvil_ctl.persistence.current_models import (
    PROJECTION_MODELS,
    GpuOwnerCurrent,
    IdentityCurrent,
    LockHeld,
    ServingInterval,
    TxCurrent,
)
from anvil_ctl.persistence.models import (
    Base,
    GpuOwnershipEvent,
    IdentityRow,
    LockRow,
    Transaction,
    TransactionState,
)

COMMITTED = "committed"
RUNNING = "running"
UNRESOLVED = sorted(s.value for s in UNRESOLVED_STATES)
INCUMBENT = "incumbent"
C = TypeVar("C", bound=Base)

REVISION_KINDS = ("adopt", "load", "promote", "canary", "rollback")
"""The transaction kinds that change what a slot serves: each one that ran is a revision of
its slot (`tx_current.revision`; refusals never ran)."""


# -- kept up to date by the writers ------------------------------------------------------------


def _current(model: type[C], *rows: Base, **values: object) -> C:
    """A projection row of `model`: the columns it shares by name with `rows` (the last row's
    where several have one), then `values`."""
    columns = model.__table__.columns.keys()
    shared = {c.name: getattr(r, c.name) for r in rows for c in r.__table__.columns if c.name in columns}
    return model(**(shared | values))


def on_begin(s: Session, tx: Transaction, state: TransactionState) -> None:
    """A transaction was planned: its row, at its first state."""
    unresolved = int(state.state in UNRESOLVED)
    s.add(
        _current(
            TxCurrent, tx, state, tx_id=tx.id, state_id=state.id, unresolved=unresolved, updated_at=state.at
        )
    )


def on_transition(s: Session, state: TransactionState) -> None:
    """A transaction moved on; committing places its incumbent in the serving history."""
    cur = s.get(TxCurrent, state.tx_id)
    if cur is None:  # a transaction without a projection row: history is the truth
        raise LookupError(f"tx_current has no row for {state.tx_id}; rebuild the projection")
    cur.state, cur.reason, cur.state_id, cur.updated_at = state.state, state.reason, state.id, state.at
    cur.unresolved = int(state.state in UNRESOLVED)
    slot = cur.slot
    if state.state == RUNNING and cur.revision is None and cur.kind in REVISION_KINDS and slot is not None:
        # a revision of its slot begins: it runs while it holds its host's lock, so a slot's
        # revisions run in the order they began, the order `rebuild` numbers them in
        cur.revision = newest_revision(s, cur.host_id, slot) + 1
    if state.state == COMMITTED:
        _place_interval(s, state.tx_id)


def newest_revision(s: Session, host: int, slot: str) -> int:
    """The number of the slot's newest revision, which is how many it has (0: none): a search of
    `ix_tx_current_revision`, whose condition `revision IS NOT NULL` is written out so that
    SQLite may use the partial index."""
    newest = s.execute(
        select(func.max(TxCurrent.revision)).where(
            TxCurrent.host_id == host, TxCurrent.slot == slot, TxCurrent.revision.is_not(None)
        )
    ).scalar()
    return newest or 0


def on_identity(s: Session, row: IdentityRow) -> None:
    """An identity was recorded: the latest of its (slot, role); an incumbent recorded for a
    committed transaction moves that transaction's serving interval to it."""
    s.merge(_current(IdentityCurrent, row, identity_id=row.id))  # by its key: added or updated
    if row.role == INCUMBENT and row.tx_id is not None:
        tx = s.get(TxCurrent, row.tx_id)
        if tx is not None and tx.state == COMMITTED:
            _place_interval(s, row.tx_id)


def on_gpu_event(s: Session, row: GpuOwnershipEvent) -> None:
    """A claim makes its container the role's owner; a release leaves the role unowned."""
    if row.event != "claim":
        cur = s.get(GpuOwnerCurrent, (row.host_id, row.role))
        if cur is not None:
            s.delete(cur)
        return
    s.merge(_current(GpuOwnerCurrent, row, event_id=row.id, since=row.at))


def on_lock(s: Session, row: LockRow) -> None:
    s.add(_current(LockHeld, row, lock_id=row.id))


def on_lock_release(s: Session, lock_id: str) -> None:
    held = s.get(LockHeld, lock_id)
    if held is not None:
        s.delete(held)


def _neighbour(s: Session, host: int, slot: str, identity_id: int, *, after: bool) -> ServingInterval | None:
    q = select(ServingInterval).where(ServingInterval.host_id == host, ServingInterval.slot == slot)
    if after:
        q = q.where(ServingInterval.identity_id > identity_id).order_by(ServingInterval.identity_id)
    else:
        q = q.where(ServingInterval.identity_id < identity_id).order_by(ServingInterval.identity_id.desc())
    return s.execute(q.limit(1)).scalar()


def _place_interval(s: Session, tx_id: str) -> None:
    """The committed transaction's last incumbent, in identity order among its slot's
    intervals (as `LEAD(at) OVER (PARTITION BY slot ORDER BY id)` would put it)."""
    s.flush()
    ident = s.execute(
        select(IdentityRow)
        .where(IdentityRow.tx_id == tx_id, IdentityRow.role == INCUMBENT)
        .order_by(IdentityRow.id.desc())
        .limit(1)
    ).scalar()
    if ident is None:
        return
    host = ident.host_id
    for old in s.execute(select(ServingInterval).where(ServingInterval.tx_id == tx_id)).scalars().all():
        before = _neighbour(s, old.host_id, old.slot, old.identity_id, after=False)
        if before is not None:
            before.served_until = old.served_until
        s.delete(old)
        s.flush()
    nxt = _neighbour(s, host, ident.slot, ident.id, after=True)
    before = _neighbour(s, host, ident.slot, ident.id, after=False)
    if before is not None:
        before.served_until = ident.at
    s.add(
        ServingInterval(
            identity_id=ident.id,
            host_id=host,
            slot=ident.slot,
            tx_id=tx_id,
            served_from=ident.at,
            served_until=nxt.served_from if nxt is not None else None,
        )
    )
    s.flush()


# -- reads -------------------------------------------------------------------------------------


def tx_rows_in(s: Session, states: frozenset[str], host: int | None = None) -> list[TxCurrent]:
    """Transactions whose current state is one of `states` (unresolved ones), oldest first, of
    host `host` where given: from the partial index, a handful of rows at any size."""
    if not states <= set(UNRESOLVED):
        raise ValueError(f"not unresolved states: {sorted(states - set(UNRESOLVED))}")
    # No plan may walk the whole history: `unresolved = 1` as a literal (the partial index's own
    # condition), no ORDER BY (sorted here), and `host_id + 0`, which no host index can serve.
    q = select(TxCurrent).where(
        TxCurrent.unresolved == literal_column("1"), TxCurrent.state.in_(sorted(states))
    )
    if host is not None:
        q = q.where(TxCurrent.host_id + literal_column("0") == host)
    return sorted(s.execute(q).scalars(), key=lambda r: (r.created_at, r.tx_id))


# -- derived from history alone ------------------------------------------------------------------

# ruff: noqa: S608 -- the f-strings below join constant SQL, never input
_LATEST_STATE = """
    SELECT s.tx_id, s.id, s.state, s.reason, s.at FROM transaction_states s
    WHERE s.id = (SELECT max(x.id) FROM transaction_states x WHERE x.tx_id = s.tx_id)
"""

_REBUILD: dict[str, str] = {
    "tx_current": f"""
        SELECT t.id AS tx_id, t.host_id, t.kind, t.slot, l.state, l.reason, l.id AS state_id,
               CASE WHEN l.state IN :unresolved THEN 1 ELSE 0 END AS unresolved,
               t.owner_pid, t.owner_host, t.owner_boot_id, t.created_at, l.at AS updated_at,
               rv.revision
        FROM transactions t JOIN ({_LATEST_STATE}) l ON l.tx_id = t.id
        LEFT JOIN (
            SELECT n.tx_id, ROW_NUMBER() OVER (PARTITION BY n.host_id, n.slot ORDER BY n.first_state)
                   AS revision
            FROM (
                SELECT x.id AS tx_id, x.host_id, x.slot,
                       (SELECT min(f.id) FROM transaction_states f WHERE f.tx_id = x.id) AS first_state
                FROM transactions x
                WHERE x.kind IN :revision_kinds AND x.slot IS NOT NULL
                  AND EXISTS (SELECT 1 FROM transaction_states r WHERE r.tx_id = x.id AND r.state = 'running')
            ) n
        ) rv ON rv.tx_id = t.id
        ORDER BY t.id
    """,
    "identity_current": """
        SELECT i.host_id, i.slot, i.role, i.id AS identity_id, i.container_id, i.digest, i.at
        FROM identities i
        WHERE i.id = (SELECT max(j.id) FROM identities j
                      WHERE j.host_id = i.host_id AND j.slot = i.slot AND j.role = i.role)
        ORDER BY i.host_id, i.slot, i.role
    """,
    "serving_intervals": f"""
        SELECT c.id AS identity_id, c.host_id, c.slot, c.tx_id, c.at AS served_from,
               LEAD(c.at) OVER (PARTITION BY c.host_id, c.slot ORDER BY c.id) AS served_until
        FROM (
            SELECT i.id, i.host_id, i.slot, i.tx_id, i.at
            FROM identities i JOIN ({_LATEST_STATE}) l ON l.tx_id = i.tx_id
            WHERE i.role = 'incumbent' AND l.state = 'committed'
              AND i.id = (SELECT max(j.id) FROM identities j
                          WHERE j.tx_id = i.tx_id AND j.role = 'incumbent')
        ) c
        ORDER BY identity_id
    """,
    "gpu_owner_current": """
        SELECT e.host_id, e.role, e.id AS event_id, e.container_id, e.tx_id, e.mode, e.slot, e.at AS since
        FROM gpu_ownership_events e
        WHERE e.event = 'claim'
          AND e.id = (SELECT max(x.id) FROM gpu_ownership_events x
                      WHERE x.host_id = e.host_id AND x.role = e.role)
        ORDER BY e.host_id, e.role
    """,
    "lock_held": """
        SELECT l.id AS lock_id, l.host_id, l.host, l.since FROM locks l
        WHERE NOT EXISTS (SELECT 1 FROM lock_releases r WHERE r.lock_id = l.id)
        ORDER BY l.id
    """,
}


def rebuild(s: Session) -> dict[str, list[dict[str, object]]]:
    """Every projection table's rows as history says they are (full scans: not for commands)."""
    out: dict[str, list[dict[str, object]]] = {}
    for name, sql in _REBUILD.items():
        q = text(sql)
        if ":unresolved" in sql:
            q = q.bindparams(
                bindparam("unresolved", value=UNRESOLVED, expanding=True),
                bindparam("revision_kinds", value=list(REVISION_KINDS), expanding=True),
            )
        out[name] = [dict(r._mapping) for r in s.execute(q)]
    return out


def maintained(s: Session) -> dict[str, list[dict[str, object]]]:
    """Every projection table's rows as they are stored, in `rebuild`'s order (the key's)."""
    return {
        name: [dict(r) for r in s.execute(select(m.__table__).order_by(*m.__table__.primary_key)).mappings()]
        for name, m in PROJECTION_MODELS.items()
    }


def compare(s: Session) -> list[str]:
    """The projection tables whose stored rows differ from a rebuild from history."""
    want, have = rebuild(s), maintained(s)
    return [name for name in _REBUILD if want[name] != have[name]]


def write_rebuilt(s: Session, host: int | None = None) -> None:
    """Insert the projection's rows as history says they are, of `host` only where given (the
    host `db copy` brought in; a database built in bulk, its projection emptied first)."""
    for name, rows in rebuild(s).items():
        mine = [r for r in rows if host is None or r["host_id"] == host]
        if mine:
            s.execute(insert(PROJECTION_MODELS[name]), mine)
