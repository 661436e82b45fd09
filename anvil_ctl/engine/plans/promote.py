"""`promote`: route the slot's tier to a qualified candidate; it becomes the incumbent.

Pivot: `route-to-candidate`. Once the tier routes to the candidate, clients
reach it: a crash after that is finished forward (smoke, acceptance, records),
not undone. The goal, checked after the last step and re-applied once, is that
the tier still routes to the candidate (a router restarted mid-promote loses it).

Refused before mutation unless the candidate has a `verified` decision for its
exact identity (or one reclassified under waivers that are all still active), the
candidate is the container serving the slot, the incumbent's rollback identity is
complete and restorable, the router accepts our credentials and an approver is
named. Steps: readmit the tier to the candidate (undo: drain it again); an
authenticated routed smoke; real-client acceptance with the `openai` client;
free VRAM per card after that acceptance against the reserve in force (waivers
apply as for qualification; below it, the promotion is undone like a failed
acceptance), written to the promotion's own evidence bundle; record the candidate
as incumbent and the old incumbent as the rollback identity with the approval and
that reading (undo: record the old incumbent back).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.core.guards import Guard, Refusal
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_objects
from anvil_ctl.core.steps import NoMemo, Plan, Step, StepContext, StepResult
from anvil_ctl.engine.gpu_ownership import reserve_reading
from anvil_ctl.engine.guards import (
    BaseVerified,
    NoUnresolvedTransaction,
    RollbackIdentityComplete,
    RollbackIdentityRestorable,
    RouterCredentialsAccepted,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import PromoteArgs, PromoteRequest
from anvil_ctl.engine.serving import (
    drain_slot,
    identity_drift,
    route_problems,
    route_slot_to,
    route_step,
    routed_expectation,
    smoke_step,
    through_the_route,
)
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import approvals, qualification, waiver_rows
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.persistence.store import Store

Ctx = StepContext[PromoteArgs, World, NoMemo]


class Promotion(Protocol):
    """What the promotion guards read; a plain and a canary promotion both carry it."""

    @property
    def slot(self) -> str: ...
    @property
    def candidate(self) -> Identity: ...
    @property
    def decision_id(self) -> str | None: ...
    @property
    def decision_outcome(self) -> str | None: ...
    @property
    def approved_by(self) -> str: ...


PCtx = StepContext[Promotion, World, object]


def standing_decision(store: Store, identity_digest: str) -> DecisionRecord | None:
    """The newest decision for this identity whose waivers (if any) are all still active."""
    now = datetime.now(UTC)
    active = {w.id for w in waiver_rows.waivers(store) if w.active(now)}
    # Newest first, a page at a time: the newest decision almost always stands, and an
    # identity qualified thousands of times must not load them all.
    page, offset = 16, 0
    while True:
        found = qualification.decisions(
            store, identity_digest=identity_digest, newest_first=True, limit=page, offset=offset
        )
        for d in found:
            if all(wid in active for wid in d["waiver_ids"]):
                return d
        if len(found) < page:
            return None
        offset += page
        page *= 4


def prepare(world: World, req: PromoteRequest) -> PromoteArgs:
    """The slot's loaded candidate (the one `req.candidate` names, if given), its incumbent
    and the candidate's standing decision, each read once."""
    store = world.store
    world.config.slot(req.slot)
    cand = store.current_identity(req.slot, "candidate")
    if cand is None:
        raise BadInput(f"slot {req.slot}: no candidate has been loaded", field="candidate")
    ref = req.candidate
    if ref and not (
        cand.container_id.startswith(ref) or cand.served_model == ref or cand.digest.startswith(ref)
    ):
        raise BadInput(
            f"candidate {ref!r} is not the slot's loaded candidate "
            f"({cand.container_id[:12]}, {cand.served_model})",
            field="candidate",
        )
    decision = standing_decision(store, cand.qualification_digest)
    return PromoteArgs(
        slot=req.slot,
        candidate=cand,
        incumbent=store.current_identity(req.slot, "incumbent"),
        decision_id=str(decision["id"]) if decision else None,
        approved_by=req.approved_by,
        accept_drift=req.accept_drift,
        decision_outcome=str(decision["outcome"]) if decision else None,
    )


class RouterConfigured(Guard[PCtx]):
    """Promotion means routing: a host without a router has nothing to promote to."""

    def check(self, ctx: PCtx) -> Refusal | None:
        if ctx.world.router is None:
            return self.refuse("promote needs a router: the host config's router.kind is 'none'")
        return None


class ApproverNamed(Guard[PCtx]):
    """A promotion names the person who approved it."""

    def check(self, ctx: PCtx) -> Refusal | None:
        if not ctx.args.approved_by.strip():
            return self.refuse("--approved-by NAME is required for a promotion")
        return None


class CandidateVerified(Guard[PCtx]):
    """The candidate's exact identity (its qualification digest) has a standing `verified`
    decision: the one `prepare` read."""

    def check(self, ctx: PCtx) -> Refusal | None:
        cand, decision_id = ctx.args.candidate, ctx.args.decision_id
        if decision_id is None:
            return self.refuse(
                f"no decision recorded for candidate identity {cand.qualification_digest[:12]} "
                f"({cand.served_model}); run `anvilctl qualify --slot {cand.slot}` first"
            )
        if ctx.args.decision_outcome != "verified":
            return self.refuse(
                f"candidate {cand.served_model} decision is {ctx.args.decision_outcome} "
                f"(decision {decision_id[:12]}); only a verified decision can be promoted",
                decision=decision_id,
            )
        return None


class CandidateIsServing(Guard[PCtx]):
    """The candidate container runs with its recorded image and fingerprint and serves the slot."""

    def check(self, ctx: PCtx) -> Refusal | None:
        cand = ctx.args.candidate
        drift = identity_drift(ctx.world, cand, running=True)
        short = cand.container_id[:12]
        for d in drift:
            if d.field == "container":
                return self.refuse(f"candidate container {short} is gone")
            if d.field == "status":
                return self.refuse(f"candidate container {short} is {d.observed}")
        if drift:
            return self.refuse(f"candidate container {short} drifted from its identity")
        served = [m.id for m in ctx.world.server.models(ctx.world.config.slot(cand.slot).base_url)]
        if served != [cand.served_model]:
            return self.refuse(f"slot serves {served}, not the candidate {cand.served_model!r}")
        return None


GUARDS: list[Guard[Ctx]] = [
    RouterConfigured(),
    ApproverNamed(),
    CandidateVerified(),
    CandidateIsServing(),
    NoUnresolvedTransaction(),
    BaseVerified(lambda ctx: ctx.args.candidate, routed=False),
    RollbackIdentityComplete(),
    RollbackIdentityRestorable(lambda ctx: ctx.args.incumbent),
    RouterCredentialsAccepted(),
]


def drain_again(ctx: Ctx, _r: StepResult) -> StepResult:
    return {**drain_slot(ctx.world, ctx.args.slot), "drained": True}


ACCEPTANCE_GATES: dict[str, str] = {"tool_call": "tools"}
"""Real-client acceptance checks that are a qualification gate seen through the router: a
decision that relied on a waiver of that gate does not require the check either."""


def waived_checks(world: World, decision_id: str | None) -> dict[str, str]:
    """Acceptance check -> the gate waiver the promoted decision relied on for its gate."""
    if decision_id is None:
        return {}
    decision = qualification.decision(world.store, decision_id)
    if decision is None:
        return {}
    relied = {w.id: w for w in waiver_rows.waivers(world.store) if w.id in decision["waiver_ids"]}
    out = {}
    for check, gate in ACCEPTANCE_GATES.items():
        for w in relied.values():
            if gate in w.gates:
                out[check] = w.id
    return out


def acceptance(ctx: Ctx) -> StepResult:
    world, cand = ctx.world, ctx.args.candidate
    accept = world.acceptance
    if accept is None:
        raise StepFailed("no real-client acceptance is configured for this router")
    alias, expected = routed_expectation(world, cand)
    waived = waived_checks(world, ctx.args.decision_id)

    def run() -> StepResult:
        result = accept(alias, expected)
        data: JSONObject = result.as_dict()
        failed = result.failed_checks()
        required = [name for name in failed if name not in waived]
        if required or not (result.passed or failed):
            raise StepFailed(f"real-client acceptance failed: {data}", acceptance=data)
        if failed:
            data["waived"] = {name: waived[name] for name in failed}
        return data

    return through_the_route(world, cand, run)


def vram_after_acceptance(ctx: Ctx) -> StepResult:
    """Free VRAM per card after real clients ran, against the reserve in force; evidence on disk."""
    from anvil_ctl.evidence.bundle import EvidenceWriter

    world, cand = ctx.world, ctx.args.candidate
    reading = reserve_reading(world, cand, when="after real-client acceptance")
    # A re-run after a crash keeps the earlier reading and adds its own: evidence is immutable.
    writer = EvidenceWriter(world.settings.evidence_dir, ctx.tx_id, resume=True)
    artifact = writer.write_json(
        writer.free_name("vram-after-acceptance"),
        {**reading, "tx_id": ctx.tx_id, "slot": cand.slot, "container_id": cand.container_id},
    )
    manifest = writer.write_manifest(kind="promotion", served_model=cand.served_model)
    # The manifest's own hash binds the directory to this record (`evidence verify`, the report).
    qualification.record_manifest(world.store, ctx.tx_id, manifest.sha256, kind="promotion")
    data = {**reading, "artifact": artifact.path, "manifest_sha256": manifest.sha256}
    if not reading["passed"]:
        low = ", ".join(
            f"{c['role']} {c['free_mib']} < {c['threshold_mib']} MiB"
            for c in get_objects(reading, "cards")
            if not c["passed"]
        )
        raise StepFailed(f"free VRAM after acceptance is below the reserve in force: {low}", reading=data)
    return data


def record_promotion(ctx: Ctx) -> StepResult:
    world, args = ctx.world, ctx.args
    old = args.incumbent
    if old is None:
        raise StepFailed(f"slot {args.slot}: no incumbent to keep as the rollback identity")
    with world.store.together():  # records only: one database transaction, one audit entry
        world.store.record_identity(ctx.tx_id, "incumbent", args.candidate)
        world.store.record_identity(ctx.tx_id, "rollback", old)
        approvals.record_approval(
            world.store,
            tx_id=ctx.tx_id,
            decision_id=args.decision_id or "",
            approved_by=args.approved_by,
        )
    return {
        "incumbent": args.candidate.container_id,
        "rollback": old.container_id,
        "approved_by": args.approved_by,
        "decision_id": args.decision_id,
        # The reading itself is the vram-after-acceptance step's result, in this transaction's
        # journal, once; the promotion record names it.
        "vram_after_acceptance": _reading_ref(ctx.results.get("vram-after-acceptance")),
    }


def _reading_ref(reading: JSONValue) -> JSONObject | None:
    """Where the promotion's VRAM reading is: its step, whether it passed, its manifest."""
    if not isinstance(reading, dict):
        return None
    return {
        "step": "vram-after-acceptance",
        "passed": reading.get("passed"),
        "manifest_sha256": reading.get("manifest_sha256"),
    }


def unrecord_promotion(ctx: Ctx, _r: StepResult) -> StepResult:
    old = ctx.args.incumbent
    if old is None:
        return {"incumbent": None}
    ctx.world.store.record_identity(ctx.tx_id, "incumbent", old)
    return {"incumbent": old.container_id}


def reroute(ctx: Ctx) -> None:
    """The goal's repair: the route broke after readmission, so a removal may be pending."""
    route_slot_to(ctx.world, ctx.args.candidate, hold=True)


def _candidate(ctx: Ctx) -> Identity:
    return ctx.args.candidate


def build(
    args: PromoteArgs, world: World, _req: PromoteRequest | None = None
) -> Plan[PromoteArgs, World, NoMemo]:
    return Plan(
        kind="promote",
        args=args,
        steps=[
            route_step("route-to-candidate", _candidate, "route the tier to the candidate", drain_again),
            smoke_step(_candidate),
            Step("acceptance", acceptance, None, "real-client acceptance (openai: chat, stream, tool)"),
            Step(
                "vram-after-acceptance",
                vram_after_acceptance,
                None,
                "free VRAM per card after acceptance against the reserve in force",
            ),
            Step(
                "record-promotion",
                record_promotion,
                unrecord_promotion,
                "candidate becomes incumbent; old incumbent the rollback identity; approval",
            ),
        ],
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        pivot="route-to-candidate",
        goal=lambda ctx: route_problems(ctx.world, ctx.args.candidate),
        repair=reroute,
    )
