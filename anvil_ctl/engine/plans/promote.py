"""`promote`: route the slot's tier to a qualified candidate; it becomes the incumbent.

Pivot: `route-to-candidate`; the goal is that the tier still routes to the candidate. Watched,
it stays `watching` while `engine.watch` samples through the route; a breach, `promote --abort`
or SIGINT/SIGTERM ends it `rolled_back`, followed by a rollback to the old incumbent.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, get_objects
from anvil_ctl.core.steps import Guard, NoMemo, Plan, Record, Refusal, Step, StepContext, StepResult, WatchEnd
from anvil_ctl.engine.gpu_ownership import reserve_reading
from anvil_ctl.engine.guards import (
    BaseVerified,
    CandidateIsServing,
    NoUnresolvedTransaction,
    RollbackIdentityComplete,
    RollbackIdentityRestorable,
    RouterConfigured,
    RouterCredentialsAccepted,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import (
    CanaryArgs,
    PromoteArgs,
    PromoteRequest,
    RollbackRequest,
    WatchDeclaration,
)
from anvil_ctl.engine.serving import (
    drain_slot,
    reroute,
    route_problems,
    route_step,
    routed_expectation,
    smoke_step,
    through_the_route,
)
from anvil_ctl.engine.world import World

if TYPE_CHECKING:
    from anvil_ctl.engine.watch import Verdict
from anvil_ctl.persistence import qualification, waiver_rows
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.persistence.store import Store

Ctx = StepContext[PromoteArgs, World, NoMemo]


PCtx = StepContext[PromoteArgs | CanaryArgs, World, object]
"""A plain or a canary promotion: what the promotion guards and closing steps read."""
_C = TypeVar("_C", bound=PCtx)


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
    """The slot's loaded candidate, its incumbent and its standing decision, each read once."""
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
    if req.watch_s is not None and req.watch_s < 0:
        raise BadInput(f"--watch {req.watch_s:g}: expected a duration >= 0", field="watch")
    return PromoteArgs(
        slot=req.slot,
        candidate=cand,
        incumbent=store.current_identity(req.slot, "incumbent"),
        decision_id=str(decision["id"]) if decision else None,
        approved_by=req.approved_by,
        accept_drift=req.accept_drift,
        decision_outcome=str(decision["outcome"]) if decision else None,
        watch=declare_watch(world, cand, req.watch_s),
        chain=req.chain,
    )


def declare_watch(world: World, cand: Identity, duration_s: float | None) -> WatchDeclaration | None:
    """The watch of this promote, every limit made absolute now (None: a cutover)."""
    from anvil_ctl.engine.watch import qualified, standing_policy

    policy, origin = standing_policy(world.store, cand, None)
    duration = policy.duration_s if duration_s is None else duration_s
    if duration <= 0:
        return None
    values, baseline = qualified(world.store, world.settings.evidence_dir, cand)
    return WatchDeclaration(
        duration_s=duration,
        interval_s=policy.interval_s,
        requests=policy.requests,
        max_tokens=policy.max_tokens,
        consecutive=policy.consecutive,
        limits=tuple(lim.as_dict() for lim in policy.limits(values)),
        policy=policy.as_dict(),
        origin={**origin, "qualified": {**values}, "baseline": baseline},
    )


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


class WatchCanSample(Guard[Ctx]):
    """A watched promote samples through the router with its client key: it must have one."""

    def check(self, ctx: Ctx) -> Refusal | None:
        if ctx.args.watch is not None and ctx.world.route_sample is None:
            return self.refuse("--watch samples through the router with its client key: none is available")
        return None


GUARDS: list[Guard[Ctx]] = [
    RouterConfigured(),
    WatchCanSample(),
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
    relied = [w for w in waiver_rows.waivers(world.store) if w.id in decision["waiver_ids"]]
    return {check: w.id for check, gate in ACCEPTANCE_GATES.items() for w in relied if gate in w.gates}


def acceptance(ctx: PCtx) -> StepResult:
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


def vram_after_acceptance(ctx: PCtx) -> StepResult:
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


def record_promotion(ctx: PCtx) -> StepResult:
    world, args, reading = ctx.world, ctx.args, ctx.results.get("vram-after-acceptance")
    old = args.incumbent
    if old is None:
        raise StepFailed(f"slot {args.slot}: no incumbent to keep as the rollback identity")
    with world.store.together():  # records only: one database transaction, one audit entry
        world.store.record_identity(ctx.tx_id, "incumbent", args.candidate)
        world.store.record_identity(ctx.tx_id, "rollback", old)
        qualification.record_approval(
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
        # journal, once; the promotion record names it: its step, whether it passed, its manifest.
        "vram_after_acceptance": {
            "step": "vram-after-acceptance",
            "passed": reading.get("passed"),
            "manifest_sha256": reading.get("manifest_sha256"),
        }
        if isinstance(reading, dict)
        else None,
    }


def unrecord_promotion(ctx: PCtx, _r: StepResult) -> StepResult:
    old = ctx.args.incumbent
    if old is None:
        return {"incumbent": None}
    ctx.world.store.record_identity(ctx.tx_id, "incumbent", old)
    return {"incumbent": old.container_id}


def _candidate(ctx: Ctx) -> Identity:
    return ctx.args.candidate


def watch_serve(ctx: Ctx, record: Record) -> WatchEnd:
    """Watch the new incumbent; run again by `recover`, it goes on from the journaled start."""
    from anvil_ctl.engine.watch import Interrupts, route_baseline, route_sampler, stopper, watch, within
    from anvil_ctl.qualify import slosample  # noqa: F401  # the first sample's client, loaded before the start
    from anvil_ctl.qualify.watchpolicy import Limit

    world, cand, decl = ctx.world, ctx.args.candidate, ctx.args.watch
    assert decl is not None
    began = next(
        (e.detail for e in world.store.step_events(ctx.tx_id) if e.step == "watch" and e.event == "begin"),
        None,
    )
    resumed = began is not None  # journaled by the run that died: `recover` goes on with it
    if began is None:
        began = route_baseline(world, cand)
        record("begin", {**began, "serve": cand.container_id, "duration_s": decl.duration_s})
    since = float(str(began["since"]))
    left = max(0.0, decl.duration_s - (time.time() - since))
    if resumed:
        record("resume", {"since": since, "left_s": round(left, 3)})
    limits = [Limit.of(lim) for lim in decl.limits]
    sampler = route_sampler(
        world, cand, requests=decl.requests, max_tokens=decl.max_tokens, limits=limits, baseline=began
    )
    with Interrupts().installed() as interrupts:
        verdict = watch(
            duration_s=left,
            interval_s=decl.interval_s,
            consecutive=decl.consecutive,
            judge=within(limits, decl.consecutive),
            take=sampler,
            record=lambda sample: record("sample", dict(sample)),
            stop=stopper(world.store, ctx.tx_id, interrupts),
        )
    if verdict.healthy:
        return WatchEnd(True, f"watch healthy: {verdict.samples} samples", {"watch": verdict.as_dict()})
    return _roll_back(ctx, verdict)


def _roll_back(ctx: Ctx, verdict: Verdict) -> WatchEnd:
    """End the watch `rolled_back`; its rollback, to the old incumbent, follows."""
    old, decl = ctx.args.incumbent, ctx.args.watch
    assert old is not None and decl is not None  # RollbackIdentityComplete; a watched plan
    undoes: JSONObject = {"tx_id": ctx.tx_id, "kind": "promote"}
    decided: JSONObject
    if verdict.stopped_by is not None:
        who = verdict.stopped_by
        decided = {"policy": "person", **who, "undoes": undoes}
        reason = f"watch stopped by {who.get('by')} ({who.get('via')}): rolling back"
    else:
        decided = {
            "policy": "watch",
            "profile": str(decl.policy.get("source")),
            "consecutive": decl.consecutive,
            "breaches": [*verdict.breaches],
            "breaching_samples": [dict(s) for s in verdict.breaching],
            "undoes": undoes,
        }
        named = ", ".join(
            f"{b['metric']} {b['observed']} vs {b['op']} {b['limit']}" for b in verdict.breaches
        )
        reason = f"watch breach after {verdict.samples} samples: {named}; rolling back"
    request = RollbackRequest(slot=ctx.args.slot, to=old.container_id, decided_by=decided)
    return WatchEnd(False, reason, {"watch": verdict.as_dict(), "decided_by": decided}, request)


def closing_steps() -> list[Step[_C]]:
    """What ends every promotion, cutover or canary: acceptance, VRAM after it, the record."""
    return [
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
    ]


def build(args: PromoteArgs, world: World, _req: object = None) -> Plan[PromoteArgs, World, NoMemo]:
    return Plan(
        kind="promote",
        args=args,
        steps=[
            route_step("route-to-candidate", _candidate, "route the tier to the candidate", drain_again),
            smoke_step(_candidate),
            *closing_steps(),
        ],
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        pivot="route-to-candidate",
        goal=lambda ctx: route_problems(ctx.world, ctx.args.candidate),
        repair=reroute(_candidate),
        watch=watch_serve if args.watch is not None else None,
    )
