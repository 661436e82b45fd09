"""Read-only audit queries over the history: transactions, their journal, diffs, identities.

These serve `anvilctl audit`; each returns plain JSON-able dicts, and none
writes. The listings go through the stable operator views (`v_transactions`,
`v_identities`, see migrations 0003), so they answer what an operator's own
`sqlite3` query would.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, text

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.persistence.models import (
    IdentityRow,
    SnapshotDiff,
    SnapshotRow,
    StepEventRow,
    Transaction,
    TransactionState,
)
from anvil_ctl.persistence.store import Store


def transactions(
    store: Store,
    *,
    kind: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The newest `limit` transactions (with their current state), filtered by the given fields."""
    sql = "SELECT tx_id, kind, slot, state, reason, created_at, updated_at FROM v_transactions WHERE 1=1"
    params: dict[str, Any] = {"limit": limit}
    if kind:
        sql += " AND kind = :kind"
        params["kind"] = kind
    if state:
        sql += " AND state = :state"
        params["state"] = state
    if since:
        sql += " AND created_at >= :since"
        params["since"] = since
    sql += " ORDER BY created_at DESC LIMIT :limit"
    with store.read() as s:
        return [dict(r._mapping) for r in s.execute(text(sql), params)]


def transaction_ids(store: Store, prefix: str) -> list[str]:
    """IDs of the transactions whose ID starts with `prefix`."""
    # On SQLite a key range, not LIKE (which cannot use the BINARY primary-key index): U+FFFF
    # sorts after every character an ID holds. PostgreSQL's collations may not order IDs
    # byte-wise, so there it stays a prefix match.
    q = select(Transaction.id).where(Transaction.id.startswith(prefix, autoescape=True))
    with store.read() as s:
        if s.get_bind().dialect.name == "sqlite":
            q = select(Transaction.id).where(Transaction.id >= prefix, Transaction.id < prefix + "\uffff")
        return [i for i in s.execute(q).scalars() if i.startswith(prefix)]


def transaction_detail(store: Store, tx_id: str) -> dict[str, Any]:
    """One transaction with its states, step events, snapshots and identities, each in order."""
    with store.read() as s:
        t = s.get(Transaction, tx_id)
        if t is None:
            raise StateStoreError(f"transaction {tx_id} not found", tx_id=tx_id)
        states = s.execute(
            select(TransactionState).where(TransactionState.tx_id == t.id).order_by(TransactionState.id)
        ).scalars()
        steps = s.execute(
            select(StepEventRow).where(StepEventRow.tx_id == t.id).order_by(StepEventRow.id)
        ).scalars()
        snaps = s.execute(
            select(SnapshotRow).where(SnapshotRow.tx_id == t.id).order_by(SnapshotRow.id)
        ).scalars()
        idents = s.execute(
            select(IdentityRow).where(IdentityRow.tx_id == t.id).order_by(IdentityRow.id)
        ).scalars()
        return {
            "tx_id": t.id,
            "kind": t.kind,
            "slot": t.slot,
            "created_at": t.created_at,
            "owner": {"pid": t.owner_pid, "host": t.owner_host},
            "args": json.loads(t.args_json),
            "states": [
                {"state": r.state, "reason": r.reason, "at": r.at, "data": json.loads(r.data_json)}
                for r in states
            ],
            "steps": [
                {
                    "seq": r.seq,
                    "step": r.step,
                    "phase": r.phase,
                    "event": r.event,
                    "at": r.at,
                    "detail": json.loads(r.detail_json),
                }
                for r in steps
            ],
            "snapshots": [{"label": r.label, "sha256": r.sha256, "at": r.at} for r in snaps],
            "identities": [
                {
                    "role": r.role,
                    "container_id": r.container_id,
                    "served_model": r.served_model,
                    "digest": r.digest,
                }
                for r in idents
            ],
        }


def snapshot_diffs(store: Store, tx_id: str) -> list[dict[str, Any]]:
    """The before/after snapshot comparisons one transaction recorded, in order."""
    with store.read() as s:
        rows = s.execute(
            select(SnapshotDiff).where(SnapshotDiff.tx_id == tx_id).order_by(SnapshotDiff.id)
        ).scalars()
        return [
            {
                "label": r.label,
                "equal": bool(r.equal),
                "before_sha256": r.before_sha256,
                "after_sha256": r.after_sha256,
                "changes": json.loads(r.changes_json),
            }
            for r in rows
        ]


def identities(store: Store, *, slot: str | None = None, role: str = "incumbent") -> list[dict[str, Any]]:
    """Which container served (or was recorded for) each slot in `role`, and from when."""
    sql = (
        "SELECT recorded_at, slot, role, container_id, image_id, served_model, digest, tx_id "
        "FROM v_identities WHERE role = :role"
    )
    params: dict[str, Any] = {"role": role}
    if slot:
        sql += " AND slot = :slot"
        params["slot"] = slot
    sql += " ORDER BY id"
    with store.read() as s:
        return [dict(r._mapping) for r in s.execute(text(sql), params)]
