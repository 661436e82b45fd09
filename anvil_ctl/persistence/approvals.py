"""Approvals: who approved promoting a candidate, on which decision, in which transaction.

Append-only and audited (`approval`); the promote plan writes one when the
candidate becomes the incumbent.
"""

from __future__ import annotations

from anvil_ctl.persistence.models import ApprovalRow
from anvil_ctl.persistence.store import Store, utcnow


def record_approval(store: Store, *, tx_id: str, decision_id: str, approved_by: str) -> None:
    with store.write() as s:
        s.add(ApprovalRow(tx_id=tx_id, decision_id=decision_id, approved_by=approved_by, at=utcnow()))
        store.audit(s, "approval", tx_id, {"decision_id": decision_id, "approved_by": approved_by})
