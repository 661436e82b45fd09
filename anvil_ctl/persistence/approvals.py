"""Approvals: who approved promoting a candidate, on which decision, in which transaction."""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import select

from anvil_ctl.persistence.models import ApprovalRow
from anvil_ctl.persistence.store import Store, utcnow


class ApprovalRecord(TypedDict):
    """One approval row as `approvals()` returns it."""

    tx_id: str
    decision_id: str
    approved_by: str
    at: str


def record_approval(store: Store, *, tx_id: str, decision_id: str, approved_by: str) -> None:
    with store.write() as s:
        s.add(ApprovalRow(tx_id=tx_id, decision_id=decision_id, approved_by=approved_by, at=utcnow()))
        store.audit(s, "approval", tx_id, {})  # the covered approval row holds it all


def approvals(store: Store) -> list[ApprovalRecord]:
    """Every approval, oldest first: which promotion relied on which decision, approved by whom."""
    with store.read() as s:
        rows = s.execute(
            select(ApprovalRow).where(ApprovalRow.host_id == store.host).order_by(ApprovalRow.id)
        ).scalars()
        return [
            {"tx_id": r.tx_id, "decision_id": r.decision_id, "approved_by": r.approved_by, "at": r.at}
            for r in rows
        ]
