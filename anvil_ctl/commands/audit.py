"""Read-only audit queries over the state database."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, text

from anvil_ctl.commands.context import Context
from anvil_ctl.core.errors import BadInput
from anvil_ctl.persistence.audit import verify_chain
from anvil_ctl.persistence.models import (
    IdentityRow,
    SnapshotDiff,
    SnapshotRow,
    StepEventRow,
    Transaction,
    TransactionState,
)


def transactions(
    ctx: Context,
    *,
    kind: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
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
    with ctx.store.read() as s:
        return [dict(r._mapping) for r in s.execute(text(sql), params)]


def _resolve(ctx: Context, tx: str) -> Transaction:
    with ctx.store.read() as s:
        rows = list(s.execute(select(Transaction).where(Transaction.id.startswith(tx))).scalars())
    if len(rows) != 1:
        raise BadInput(
            f"transaction {tx!r}: {'no match' if not rows else 'ambiguous prefix'}",
            field="transaction",
        )
    return rows[0]


def show(ctx: Context, tx: str) -> dict[str, Any]:
    t = _resolve(ctx, tx)
    with ctx.store.read() as s:
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


def diff(ctx: Context, tx: str) -> list[dict[str, Any]]:
    t = _resolve(ctx, tx)
    with ctx.store.read() as s:
        rows = s.execute(
            select(SnapshotDiff).where(SnapshotDiff.tx_id == t.id).order_by(SnapshotDiff.id)
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


def verify(ctx: Context) -> dict[str, Any]:
    with ctx.store.read() as s:
        count, problems = verify_chain(s)
    return {"rows": count, "ok": not problems, "problems": [p.as_dict() for p in problems]}


def identities(ctx: Context, *, slot: str | None = None, role: str = "incumbent") -> list[dict[str, Any]]:
    """Which container served (or was recorded for) each slot, and from when."""
    sql = (
        "SELECT recorded_at, slot, role, container_id, image_id, served_model, digest, tx_id "
        "FROM v_identities WHERE role = :role"
    )
    params: dict[str, Any] = {"role": role}
    if slot:
        sql += " AND slot = :slot"
        params["slot"] = slot
    sql += " ORDER BY id"
    with ctx.store.read() as s:
        return [dict(r._mapping) for r in s.execute(text(sql), params)]


def rechecks(ctx: Context, *, slot: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Recorded recheck runs, newest first: pass/fail and the failed assertions."""
    from anvil_ctl.persistence import records

    return records.rechecks(ctx.store, slot=slot, limit=limit)
