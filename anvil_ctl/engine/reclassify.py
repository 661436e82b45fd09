"""Decisions re-judged under waivers: a new record that points at the raw one, never a rewrite;
the reserve gate's stored artifact is read (hash-checked), never re-measured."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, get_int, get_object, get_objects
from anvil_ctl.core.waiver import VRAM_RESERVE, Waiver
from anvil_ctl.engine.world import World
from anvil_ctl.gpu import waiver_policy
from anvil_ctl.gpu.vram import CardCheck, ReserveResult
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import qualification, waiver_rows
from anvil_ctl.persistence.qualification import DecisionRecord

if TYPE_CHECKING:
    from anvil_ctl.qualify.runner import QualificationResult

log = get_logger()


def raw_decision_body(
    world: World,
    ident: Identity,
    *,
    result: QualificationResult,
    active: Sequence[Waiver],
    now: datetime,
    roles: Sequence[str],
) -> JSONObject:
    """The body of a raw decision: what it was judged on, so it can be re-judged later."""
    from anvil_ctl.qualify.decision import candidate_identity_digest

    standing = {r: world.config.reserve_for(r) for r in roles}
    return {
        "policy": "standing",
        "qualify_decision": result.decision.as_dict(),
        "candidate_identity_digest": candidate_identity_digest(
            recipe_digest=ident.recipe_digest or "-",
            image_id=ident.image_id,
            model_identity=ident.model_identity or "-",
            config_fingerprint=ident.config_fingerprint,
        ),
        "recipe_digest": ident.recipe_digest,
        "served_model": ident.served_model,
        "reserve_roles": {world.config.gpu_roles[r].uuid.lower(): r for r in roles},
        "reserve_standing_mib": dict(standing),
        "reserve_in_force_mib": {
            r: waiver_policy.resolve(
                VRAM_RESERVE,
                policy_default=v,
                role=r,
                recipe_digest=ident.recipe_digest or None,
                waivers=active,
                now=now,
            ).value
            for r, v in standing.items()
        },
        "evidence_dir": str(result.tx_dir),
    }


@dataclass(frozen=True)
class _Verdict:
    name: str
    passed: bool


_OUTCOMES: tuple[waiver_policy.Outcome, ...] = ("verified", "policy-infeasible", "failed")


def _card(c: JSONObject, roles: Mapping[str, str]) -> CardCheck:
    """One card of a stored reserve artifact, as the gate checked it."""
    uuid, reserve = str(c["uuid"]), c["reserve_mib"]
    if not isinstance(reserve, int | float | str):
        raise TypeError(f"reserve_mib: expected a number, got {type(reserve).__name__}")
    return CardCheck(
        role=roles.get(uuid.lower(), uuid),
        uuid=uuid,
        threshold_mib=int(reserve),
        free_mib=get_int(c, "free_mib"),
    )


def stored_verdicts(world: World, raw: DecisionRecord) -> list[_Verdict | ReserveResult]:
    """The raw decision's gate verdicts from its evidence rows; reserve gates as ReserveResult
    rebuilt from their artifacts, whose SHA-256 must still match the recorded one."""
    roles = {uuid: str(role) for uuid, role in get_object(raw["body"], "reserve_roles").items()}
    out: list[_Verdict | ReserveResult] = []
    rows = qualification.evidence(world.store, raw["tx_id"]) if raw["tx_id"] else []
    for row in rows:
        if row["kind"] != "policy":
            out.append(_Verdict(row["gate"], row["passed"]))
            continue
        path = world.settings.evidence_dir / row["artifact"]  # an absolute artifact path stays itself
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise StepFailed(f"evidence {path} unreadable: {exc}", path=str(path)) from exc
        if sha256_hex(data) != row["sha256"]:
            raise StepFailed(f"evidence {path} does not match its recorded SHA-256")
        evidence: JSONObject = json.loads(data)["evidence"]
        cards = tuple(_card(c, roles) for c in get_objects(evidence, "cards"))
        out.append(ReserveResult(cards=cards, name=row["gate"]))
    return out


def reclassify_one(
    world: World,
    raw: DecisionRecord,
    active: Sequence[Waiver],
    now: datetime,
    *,
    tx_id: str | None,
) -> DecisionRecord | None:
    """Record (and return) a decision over `raw` when the waivers in force change its outcome."""
    store = world.store
    raw_id = raw["id"]
    chain = [raw, *qualification.reclassifications(store, [raw_id])]
    latest = chain[-1]
    digest = raw["body"].get("recipe_digest")
    outcome = next((o for o in _OUTCOMES if o == raw["outcome"]), None)
    if outcome is None:
        raise ValueError(f"decision {raw['id']}: outcome {raw['outcome']!r} is not one a decision records")
    new = waiver_policy.reclassify(
        waiver_policy.Decision(
            id=raw_id,
            outcome=outcome,
            identity_digest=raw["identity_digest"],
            evidence_id=raw["tx_id"] or raw_id,
            recipe_digest=str(digest) if digest else None,
        ),
        stored_verdicts(world, raw),
        active,
        now,
    )
    if new.outcome == latest["outcome"]:
        return None
    new_id = new.id
    if any(d["id"] == new_id for d in chain):
        # The same verdict was recorded before and superseded since: a new record, new id.
        new_id = "dec-" + sha256_hex([new.id, latest["id"]])[:16]
    qualification.record_decision(
        store,
        decision_id=new_id,
        tx_id=tx_id,
        slot=raw["slot"],
        identity_digest=raw["identity_digest"],
        container_id=raw["container_id"],
        outcome=new.outcome,
        profile=raw["profile"],
        manifest_sha256=raw["manifest_sha256"],
        reclassifies=raw_id,
        waiver_ids=new.waiver_ids,
        reasons=new.reasons,
        body={**new.as_dict(), "id": new_id, "supersedes": latest["id"]},
    )
    log.info("decision reclassified", raw=raw_id, new=new_id, outcome=new.outcome)
    recorded = qualification.decision(store, new_id)
    assert recorded is not None  # recorded above (or before, with the same content)
    return recorded


@dataclass
class ReclassifyReport:
    recorded: list[DecisionRecord] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"recorded": list(self.recorded), "skipped": list(self.skipped)}


def reclassify_decisions(
    world: World, *, slot: str | None = None, now: datetime | None = None
) -> ReclassifyReport:
    """`reclassify_one` for every stored raw decision (of `slot`)."""
    now = now or datetime.now(UTC)
    active = waiver_rows.waivers(world.store)
    report = ReclassifyReport()
    for raw in qualification.decisions(world.store, slot=slot):
        if raw["reclassifies"] is not None or raw["body"].get("policy") != "standing":
            continue
        try:
            newer = reclassify_one(world, raw, active, now, tx_id=None)
        except StepFailed as exc:
            report.skipped.append({"decision_id": raw["id"], "reason": str(exc)})
            continue
        if newer is not None:
            report.recorded.append(newer)
    return report
