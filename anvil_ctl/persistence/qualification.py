"""What qualify transactions found and decided: gate evidence, manifests, decisions, approvals.

A manifest row binds an evidence directory on disk to the database (`evidence verify`). A
decision is bound to one candidate identity digest and content-addressed (recording it twice
records it once); a reclassification is a new decision pointing at the one it re-judges. An
approval says who approved promoting a candidate, on which decision, in which transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import NotRequired, TypedDict, cast

from sqlalchemy import Select, select

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence.models import ApprovalRow, DecisionRow, EvidenceManifestRow, EvidenceRow
from anvil_ctl.persistence.store import Store, utcnow


class GateEvidence(TypedDict):
    """One gate's result as `record_evidence` takes it (absent fields take their defaults)."""

    name: str
    passed: bool
    kind: NotRequired[str]  # functional | policy | ...; "functional" when absent
    classification: NotRequired[str | None]
    artifact: NotRequired[str]  # the artifact's path
    sha256: NotRequired[str]
    size: NotRequired[int]


class EvidenceRecord(TypedDict):
    """One recorded gate as `evidence()` returns it."""

    gate: str
    kind: str
    passed: bool
    classification: str
    artifact: str
    sha256: str
    size: int
    at: str


def record_evidence(store: Store, tx_id: str, gates: Iterable[GateEvidence]) -> int:
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


def evidence(store: Store, tx_id: str) -> list[EvidenceRecord]:
    """The gates one qualify transaction recorded, in order."""
    e = EvidenceRow
    q = select(
        e.gate, e.kind, e.passed, e.classification, e.artifact_path.label("artifact"), e.sha256, e.size, e.at
    )
    with store.read() as s:
        rows = s.execute(q.where(e.tx_id == tx_id).order_by(e.id)).mappings()
        return [cast(EvidenceRecord, {**r, "passed": bool(r["passed"])}) for r in rows]


def record_manifest(
    store: Store, tx_id: str, sha256: str, *, kind: str, source_sha256: str | None = None
) -> None:
    """Record the SHA-256 of a manifest written for transaction `tx_id` (kind: qualify, ab,
    promotion, export)."""
    with store.write() as s:
        s.add(
            EvidenceManifestRow(
                tx_id=tx_id, kind=kind, sha256=sha256, source_sha256=source_sha256, at=utcnow()
            )
        )
        store.audit(s, f"evidence.manifest.{kind}", tx_id, {})  # the covered row holds it all


def manifests(store: Store, tx_id: str) -> list[EvidenceManifestRow]:
    """The manifests recorded for `tx_id`, oldest first (`source_sha256`: the manifest an
    export was made from)."""
    q = select(EvidenceManifestRow).where(EvidenceManifestRow.tx_id == tx_id).order_by(EvidenceManifestRow.id)
    with store.read() as s:
        return list(s.execute(q).scalars())


class DecisionRecord(TypedDict):
    """One decision row: `reclassifies` names the decision a reclassification re-judges."""

    id: str
    tx_id: str | None
    slot: str
    identity_digest: str
    container_id: str
    outcome: str
    profile: str
    manifest_sha256: str
    reclassifies: str | None
    waiver_ids: list[str]
    reasons: list[str]
    body: JSONObject
    at: str


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
    body: JSONObject | None = None,
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
        store.audit(s, "decision", tx_id, {})  # the covered decision row holds it all


def _decision_dict(r: DecisionRow) -> DecisionRecord:
    """The row's columns but its host, each `*_json` one parsed and named without the suffix."""
    values = {c.name: getattr(r, c.key) for c in DecisionRow.__table__.columns if c.name != "host_id"}
    parsed = {k.removesuffix("_json"): json.loads(v) if k.endswith("_json") else v for k, v in values.items()}
    return cast(DecisionRecord, parsed)


def _of_host(store: Store, q: Select[DecisionRow]) -> list[DecisionRecord]:
    """The decisions of this host that `q` selects."""
    with store.read() as s:
        return [_decision_dict(r) for r in s.execute(q.where(DecisionRow.host_id == store.host)).scalars()]


def decisions(
    store: Store,
    *,
    identity_digest: str | None = None,
    slot: str | None = None,
    newest_first: bool = False,
    limit: int | None = None,
    offset: int = 0,
) -> list[DecisionRecord]:
    """Decisions oldest first (or newest first), optionally only those of one identity digest
    and/or slot, optionally one page of them (`ix_decisions_identity_digest_at` serves it)."""
    if newest_first:
        q = select(DecisionRow).order_by(DecisionRow.at.desc(), DecisionRow.id.desc())
    else:
        q = select(DecisionRow).order_by(DecisionRow.at, DecisionRow.id)
    if limit is not None:
        q = q.limit(limit).offset(offset)
    if identity_digest:
        q = q.where(DecisionRow.identity_digest == identity_digest)
    if slot:
        q = q.where(DecisionRow.slot == slot)
    return _of_host(store, q)


def latest_decision(store: Store, identity_digest: str) -> DecisionRecord | None:
    found = decisions(store, identity_digest=identity_digest, newest_first=True, limit=1)
    return found[0] if found else None


def decision(store: Store, decision_id: str) -> DecisionRecord | None:
    """One decision of this host by its ID (its key), or None."""
    found = _of_host(store, select(DecisionRow).where(DecisionRow.id == decision_id))
    return found[0] if found else None


def reclassifications(store: Store, raw_ids: Collection[str]) -> list[DecisionRecord]:
    """This host's decisions that reclassify one of `raw_ids`, oldest first: through
    `ix_decisions_reclassifies`, which holds reclassifications only."""
    if not raw_ids:
        return []
    q = select(DecisionRow).where(
        DecisionRow.reclassifies.is_not(None),  # the partial index's condition, written out
        DecisionRow.reclassifies.in_(sorted(raw_ids)),
    )
    return _of_host(store, q.order_by(DecisionRow.at, DecisionRow.id))


def decisions_of_tx(store: Store, tx_id: str) -> list[DecisionRecord]:
    """This host's decisions recorded by transaction `tx_id` (its qualify), oldest first."""
    q = select(DecisionRow).where(DecisionRow.tx_id == tx_id).order_by(DecisionRow.at, DecisionRow.id)
    return _of_host(store, q)


def record_approval(store: Store, *, tx_id: str, decision_id: str, approved_by: str) -> None:
    with store.write() as s:
        s.add(ApprovalRow(tx_id=tx_id, decision_id=decision_id, approved_by=approved_by, at=utcnow()))
        store.audit(s, "approval", tx_id, {})  # the covered approval row holds it all


def approvals(store: Store) -> list[ApprovalRow]:
    """Every approval, oldest first: which promotion relied on which decision, approved by whom."""
    q = select(ApprovalRow).where(ApprovalRow.host_id == store.host).order_by(ApprovalRow.id)
    with store.read() as s:
        return list(s.execute(q).scalars())
