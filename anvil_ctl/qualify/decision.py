"""The qualification decision, a pure function of gate results: `verified` (every gate passed),
`policy-infeasible` (only a policy gate failed; a waiver may reclassify it) or `failed`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Literal

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import utc_stamp
from anvil_ctl.qualify.results import GateResult

Outcome = Literal["verified", "policy-infeasible", "failed"]


def decide(results: Sequence[GateResult]) -> Outcome:
    if not results or not all(r.passed for r in results if r.kind == "functional"):
        return "failed"
    return "verified" if all(r.passed for r in results) else "policy-infeasible"


def candidate_identity_digest(
    *, recipe_digest: str, image_id: str, model_identity: str, config_fingerprint: str
) -> str:
    """The digest a decision is bound to; `promote` compares it with what is running."""
    fields = {
        "recipe_digest": recipe_digest,
        "image_id": image_id,
        "model_identity": model_identity,
        "config_fingerprint": config_fingerprint,
    }
    empty = sorted(k for k, v in fields.items() if not v)
    if empty:
        raise BadInput(f"candidate identity incomplete: {', '.join(empty)} empty", missing=empty)
    return sha256_hex(fields)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    identity_digest: str
    profile: str
    gates: tuple[JSONObject, ...]
    reasons: tuple[str, ...]
    evidence_sha256: str
    decided_at: str

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "gates": [*self.gates], "reasons": [*self.reasons]}


def make_decision(
    results: Sequence[GateResult],
    identity_digest: str,
    *,
    profile: str = "",
    artifact_sha256: dict[str, str] | None = None,
) -> Decision:
    """`decide` plus what binds it: the identity, each gate's verdict and artifact hash."""
    if not identity_digest:
        raise BadInput("a decision must be bound to a candidate identity digest")
    hashes = artifact_sha256 or {}
    gates: tuple[JSONObject, ...] = tuple(
        {
            "name": r.name,
            "kind": r.kind,
            "passed": r.passed,
            "classification": r.classification,
            "artifact_sha256": hashes.get(r.name),
        }
        for r in results
    )
    reasons = tuple(
        f"{r.kind} gate {r.name} failed: {r.classification}" + (f" ({r.summary})" if r.summary else "")
        for r in results
        if not r.passed
    ) or (("no gate ran",) if not results else ())
    return Decision(
        outcome=decide(results),
        identity_digest=identity_digest,
        profile=profile,
        gates=gates,
        reasons=reasons,
        evidence_sha256=sha256_hex(list(gates)),
        decided_at=utc_stamp(datetime.now(UTC)),
    )
