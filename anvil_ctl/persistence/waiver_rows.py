"""Stored waivers: the waiver rows and the revocation rows that reading applies to them."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import select

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.validate import utc_stamp
from anvil_ctl.core.waiver import Waiver
from anvil_ctl.persistence.models import WaiverRevocation, WaiverRow
from anvil_ctl.persistence.store import Store, utcnow


def add_waiver(store: Store, w: Waiver) -> None:
    with store.write() as s:
        s.add(
            WaiverRow(
                id=w.id,
                policy=w.policy,
                roles_json=canonical_json(sorted(w.roles)),
                gates_json=canonical_json(sorted(w.gates)) if w.gates else None,
                recipe_digest=w.recipe_digest,
                value=w.value,
                approved_by=w.approved_by,
                reason=w.reason,
                created_at=utc_stamp(w.created_at),
                expires_at=utc_stamp(w.expires_at) if w.expires_at else None,
            )
        )
        store.audit(
            s,
            "waiver.created",
            None,
            {
                "id": w.id,
                "policy": w.policy,
                "roles": [*sorted(w.roles)],
                "gates": [*sorted(w.gates)],
                "recipe_digest": w.recipe_digest,
                "value": w.value,
                "approved_by": w.approved_by,
                # Said in the record: no expiry is a person's explicit choice (waive --no-expiry).
                "expires_at": utc_stamp(w.expires_at) if w.expires_at else None,
                "expiry": "explicit" if w.expires_at else "none (--no-expiry)",
            },
        )


def revoke_waiver(store: Store, waiver_id: str, *, by: str, reason: str) -> None:
    """Append a revocation; an unknown or already revoked waiver is bad input."""
    with store.write() as s:
        if s.get(WaiverRow, waiver_id) is None:
            raise BadInput(f"waiver {waiver_id} not found", field="waiver_id")
        if s.execute(select(WaiverRevocation).where(WaiverRevocation.waiver_id == waiver_id)).scalar():
            raise BadInput(f"waiver {waiver_id} is already revoked", field="waiver_id")
        s.add(WaiverRevocation(waiver_id=waiver_id, by=by, reason=reason, at=utcnow()))
        store.audit(s, "waiver.revoked", None, {"id": waiver_id, "by": by, "reason": reason})


def waivers(store: Store) -> list[Waiver]:
    """Every waiver, oldest first, revocations applied."""
    with store.read() as s:
        revoked = {
            r.waiver_id: datetime.fromisoformat(r.at.replace("Z", "+00:00"))
            for r in s.execute(select(WaiverRevocation)).scalars()
        }
        rows = list(
            s.execute(
                select(WaiverRow).where(WaiverRow.host_id == store.host).order_by(WaiverRow.created_at)
            ).scalars()
        )
    return [
        Waiver(
            id=r.id,
            policy=r.policy,
            value=r.value,
            approved_by=r.approved_by,
            reason=r.reason,
            created_at=datetime.fromisoformat(r.created_at),
            roles=frozenset(json.loads(r.roles_json)),
            gates=frozenset(json.loads(r.gates_json or "[]")),
            recipe_digest=r.recipe_digest,
            expires_at=datetime.fromisoformat(r.expires_at) if r.expires_at else None,
            revoked_at=revoked.get(r.id),
        )
        for r in rows
    ]
