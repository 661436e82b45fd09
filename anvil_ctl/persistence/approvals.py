"""Approvals: who approved promoting a candidate, on which decision, in which transaction."""

from __future__ import annotations

from sqlalchemy import select

from anvil_ctl.persistence.models import ApprovalRow
from anvil_ctl.persistence.store import Store, utcnow


def record_approval(store: Store, *, tx_id: str, decision_id: str, approved_by: str) -> None:
    with store.write() as s:
        s.add(ApprovalRow(tx_id=tx_id, decision_id=decision_id, approved_by=approved_by, at=utcnow()))
        store.audit(s, "approval", tx_id, {})  # the covered approval row holds it all


def approvals(store: Store) -> list[ApprovalRow]:
    """Every approval, oldest first: which promotion relied on which decision, approved by whom."""
    q = select(ApprovalRow).where(ApprovalRow.host_id == store.host).order_by(ApprovalRow.id)
    with store.read() as s:
        return list(s.execute(q).scalars())
