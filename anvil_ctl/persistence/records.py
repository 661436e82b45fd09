"""Writes and reads of the qualification-era tables: GPU ownership, evidence, decisions,
waivers, approvals and rechecks. All append-only; every write is audited.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import canonical_json
from anvil_ctl.persistence.models import (
    ApprovalRow,
    DecisionRow,
    EvidenceRow,
    GpuOwnershipEvent,
    RecheckRow,
    WaiverRevocation,
    WaiverRow,
)
from anvil_ctl.persistence.store import Store, utcnow

# -- GPU ownership ---------------------------------------------------------------------------


def claim_roles(
    store: Store,
    roles: Sequence[str],
    *,
    container_id: str,
    tx_id: str | None,
    mode: str,
    slot: str,
) -> None:
    with store.write() as s:
        for role in roles:
            s.add(
                GpuOwnershipEvent(
                    role=role,
                    event="claim",
                    container_id=container_id,
                    tx_id=tx_id,
                    mode=mode,
                    slot=slot,
                    at=utcnow(),
                )
            )
        store.audit(
            s,
            "gpu.claim",
            tx_id,
            {"roles": list(roles), "container_id": container_id, "mode": mode},
        )


def release_roles(store: Store, roles: Sequence[str], *, container_id: str, tx_id: str | None) -> None:
    """Release the roles `container_id` owns (roles owned by another container are left alone)."""
    owners = gpu_owners(store)
    mine = [r for r in roles if owners.get(r, {}).get("container_id") == container_id]
    if not mine:
        return
    with store.write() as s:
        for role in mine:
            s.add(
                GpuOwnershipEvent(
                    role=role,
                    event="release",
                    container_id=container_id,
                    tx_id=tx_id,
                    mode=owners[role]["mode"],
                    slot=owners[role]["slot"],
                    at=utcnow(),
                )
            )
        store.audit(s, "gpu.release", tx_id, {"roles": mine, "container_id": container_id})


def gpu_owners(store: Store) -> dict[str, dict[str, Any]]:
    """role -> {container_id, tx_id, mode, slot, since} for roles whose latest event is a claim."""
    out: dict[str, dict[str, Any]] = {}
    with store.read() as s:
        rows = s.execute(select(GpuOwnershipEvent).order_by(GpuOwnershipEvent.id)).scalars()
        for r in rows:
            if r.event == "claim":
                out[r.role] = {
                    "container_id": r.container_id,
                    "tx_id": r.tx_id,
                    "mode": r.mode,
                    "slot": r.slot,
                    "since": r.at,
                }
            else:
                out.pop(r.role, None)
    return out


# -- evidence and decisions ------------------------------------------------------------------


def record_evidence(store: Store, tx_id: str, gates: Iterable[dict[str, Any]]) -> int:
    """Each gate: name, kind, passed, classification, artifact (path), sha256, size."""
    n = 0
    with store.write() as s:
        for g in gates:
            s.add(
                EvidenceRow(
                    tx_id=tx_id,
                    gate=g["name"],
                    kind=g.get("kind", "functional"),
                    passed=int(bool(g["passed"])),
                    classification=g.get("classification") or "",
                    artifact_path=g.get("artifact", ""),
                    sha256=g.get("sha256", ""),
                    size=int(g.get("size", 0)),
                    at=utcnow(),
                )
            )
            n += 1
        store.audit(s, "evidence", tx_id, {"gates": n})
    return n


def evidence(store: Store, tx_id: str) -> list[dict[str, Any]]:
    with store.read() as s:
        rows = s.execute(
            select(EvidenceRow).where(EvidenceRow.tx_id == tx_id).order_by(EvidenceRow.id)
        ).scalars()
        return [
            {
                "gate": r.gate,
                "kind": r.kind,
                "passed": bool(r.passed),
                "classification": r.classification,
                "artifact": r.artifact_path,
                "sha256": r.sha256,
                "size": r.size,
                "at": r.at,
            }
            for r in rows
        ]


def record_decision(
    store: Store,
    *,
    decision_id: str,
    tx_id: str | None,
    slot: str,
    identity_digest: str,
    container_id: str,
    outcome: str,
    profile: str = "",
    manifest_sha256: str = "",
    reclassifies: str | None = None,
    waiver_ids: Sequence[str] = (),
    reasons: Sequence[str] = (),
    body: dict[str, Any] | None = None,
) -> None:
    with store.write() as s:
        if s.get(DecisionRow, decision_id) is not None:
            return  # decisions are content-addressed: the same decision is already recorded
        s.add(
            DecisionRow(
                id=decision_id,
                tx_id=tx_id,
                slot=slot,
                identity_digest=identity_digest,
                container_id=container_id,
                outcome=outcome,
                profile=profile,
                manifest_sha256=manifest_sha256,
                reclassifies=reclassifies,
                waiver_ids_json=canonical_json(list(waiver_ids)),
                reasons_json=canonical_json(list(reasons)),
                body_json=canonical_json(body or {}),
                at=utcnow(),
            )
        )
        store.audit(
            s,
            "decision",
            tx_id,
            {
                "id": decision_id,
                "outcome": outcome,
                "identity_digest": identity_digest,
                "reclassifies": reclassifies,
                "waiver_ids": list(waiver_ids),
            },
        )


def _decision_dict(r: DecisionRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "tx_id": r.tx_id,
        "slot": r.slot,
        "identity_digest": r.identity_digest,
        "container_id": r.container_id,
        "outcome": r.outcome,
        "profile": r.profile,
        "manifest_sha256": r.manifest_sha256,
        "reclassifies": r.reclassifies,
        "waiver_ids": json.loads(r.waiver_ids_json),
        "reasons": json.loads(r.reasons_json),
        "body": json.loads(r.body_json),
        "at": r.at,
    }


def decisions(
    store: Store, *, identity_digest: str | None = None, slot: str | None = None
) -> list[dict[str, Any]]:
    q = select(DecisionRow).order_by(DecisionRow.at, DecisionRow.id)
    if identity_digest:
        q = q.where(DecisionRow.identity_digest == identity_digest)
    if slot:
        q = q.where(DecisionRow.slot == slot)
    with store.read() as s:
        return [_decision_dict(r) for r in s.execute(q).scalars()]


def latest_decision(store: Store, identity_digest: str) -> dict[str, Any] | None:
    found = decisions(store, identity_digest=identity_digest)
    return found[-1] if found else None


# -- waivers ---------------------------------------------------------------------------------


def add_waiver(store: Store, w: Any) -> None:
    """w: anvil_ctl.gpu.waivers.Waiver."""
    with store.write() as s:
        s.add(
            WaiverRow(
                id=w.id,
                policy=w.policy,
                roles_json=canonical_json(sorted(w.roles)),
                recipe_digest=w.recipe_digest,
                value=w.value,
                approved_by=w.approved_by,
                reason=w.reason,
                created_at=w.created_at.isoformat(),
                expires_at=w.expires_at.isoformat() if w.expires_at else None,
            )
        )
        store.audit(
            s,
            "waiver.created",
            None,
            {
                "id": w.id,
                "policy": w.policy,
                "roles": sorted(w.roles),
                "recipe_digest": w.recipe_digest,
                "value": w.value,
                "approved_by": w.approved_by,
            },
        )


def revoke_waiver(store: Store, waiver_id: str, *, by: str, reason: str) -> None:
    with store.write() as s:
        if s.get(WaiverRow, waiver_id) is None:
            raise BadInput(f"waiver {waiver_id} not found", field="waiver_id")
        if s.execute(select(WaiverRevocation).where(WaiverRevocation.waiver_id == waiver_id)).scalar():
            raise BadInput(f"waiver {waiver_id} is already revoked", field="waiver_id")
        s.add(WaiverRevocation(waiver_id=waiver_id, by=by, reason=reason, at=utcnow()))
        store.audit(s, "waiver.revoked", None, {"id": waiver_id, "by": by, "reason": reason})


def waivers(store: Store) -> list[Any]:
    """Every waiver as anvil_ctl.gpu.waivers.Waiver, revocations applied."""
    from anvil_ctl.gpu.waivers import Waiver

    with store.read() as s:
        revoked = {r.waiver_id: r.at for r in s.execute(select(WaiverRevocation)).scalars()}
        rows = list(s.execute(select(WaiverRow).order_by(WaiverRow.created_at)).scalars())
    out = []
    for r in rows:
        out.append(
            Waiver(
                id=r.id,
                policy=r.policy,
                value=r.value,
                approved_by=r.approved_by,
                reason=r.reason,
                created_at=datetime.fromisoformat(r.created_at),
                roles=frozenset(json.loads(r.roles_json)),
                recipe_digest=r.recipe_digest,
                expires_at=datetime.fromisoformat(r.expires_at) if r.expires_at else None,
                revoked_at=datetime.fromisoformat(revoked[r.id].replace("Z", "+00:00"))
                if r.id in revoked
                else None,
            )
        )
    return out


# -- approvals and rechecks ------------------------------------------------------------------


def record_approval(store: Store, *, tx_id: str, decision_id: str, approved_by: str) -> None:
    with store.write() as s:
        s.add(ApprovalRow(tx_id=tx_id, decision_id=decision_id, approved_by=approved_by, at=utcnow()))
        store.audit(s, "approval", tx_id, {"decision_id": decision_id, "approved_by": approved_by})


def record_recheck(
    store: Store,
    *,
    slot: str,
    passed: bool,
    failed: Sequence[str],
    assertions: list[dict[str, Any]],
    snapshot_sha256: str,
) -> int:
    with store.write() as s:
        row = RecheckRow(
            slot=slot,
            passed=int(passed),
            failed_json=canonical_json(list(failed)),
            assertions_json=canonical_json(assertions),
            snapshot_sha256=snapshot_sha256,
            at=utcnow(),
        )
        s.add(row)
        s.flush()
        store.audit(s, "recheck", None, {"slot": slot, "passed": passed, "failed": list(failed)})
        return row.id


def rechecks(store: Store, *, slot: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    q = select(RecheckRow).order_by(RecheckRow.id.desc()).limit(limit)
    if slot:
        q = q.where(RecheckRow.slot == slot)
    with store.read() as s:
        return [
            {
                "id": r.id,
                "slot": r.slot,
                "passed": bool(r.passed),
                "failed": json.loads(r.failed_json),
                "snapshot_sha256": r.snapshot_sha256,
                "at": r.at,
            }
            for r in s.execute(q).scalars()
        ]
