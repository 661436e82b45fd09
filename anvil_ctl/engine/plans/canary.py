"""`promote --canary`: the slot's loaded candidate takes a growing share of its router tier
beside the incumbent another slot of the tier publishes, judged side by side at each step, and
becomes the incumbent at 100 %. A breach at any share compensates back to the incumbent; the
pivot is `route-to-candidate`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from anvil_ctl.core.errors import AdapterError, BadInput, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.core.ports import WeightedRouter
from anvil_ctl.core.steps import Guard, NoMemo, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine.drain import stop_drained, stop_retain_step, wait_idle
from anvil_ctl.engine.gpu_ownership import reserve_in_force
from anvil_ctl.engine.guards import (
    CandidateIsServing,
    NoUnresolvedTransaction,
    RouterConfigured,
    RouterCredentialsAccepted,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import CanaryArgs, CanaryRequest
from anvil_ctl.engine.plans.promote import (
    ApproverNamed,
    CandidateVerified,
    closing_steps,
    standing_decision,
)
from anvil_ctl.engine.serving import (
    identity_drift,
    is_running,
    pauses,
    reroute,
    route_problems,
    route_slot_to,
    router_of,
    smoke_step,
    tier_incumbent,
)
from anvil_ctl.engine.world import World

Ctx = StepContext[CanaryArgs, World, NoMemo]


def _url(world: World, ident: Identity) -> str:
    return world.config.slot(ident.slot).base_url


def _tier(world: World, ident: Identity) -> str:
    return world.config.slot(ident.slot).router_tier


def _weighted(world: World) -> WeightedRouter:
    router = world.router
    if not isinstance(router, WeightedRouter):
        raise StepFailed("the router cannot weigh traffic between two serves")
    return router


def _set_share(world: World, args: CanaryArgs, share: int) -> JSONObject:
    inc, cand = _url(world, args.incumbent), _url(world, args.candidate)
    weights = {inc: 100 - share, cand: share}
    _weighted(world).set_weights(_tier(world, args.incumbent), weights)
    return {"share": share, "weights": {**weights}}


class RouterWeighs(Guard[Ctx]):
    """The router splits one tier's requests between two backends by weight (smg cannot)."""

    def check(self, ctx: Ctx) -> Refusal | None:
        if not isinstance(ctx.world.router, WeightedRouter):
            kind = ctx.world.config.router.kind
            return self.refuse(
                f"router {kind} cannot split a tier's traffic by weight, so --canary cannot "
                "run on it (smg 1.13's policies pick among healthy workers without a weight); "
                "use HAProxy (router.kind = 'haproxy') or promote without --canary",
                router=kind,
            )
        return None


class IncumbentServesTheTier(Guard[Ctx]):
    """The incumbent runs unchanged and is what the shared tier routes to now."""

    def check(self, ctx: Ctx) -> Refusal | None:
        inc = ctx.args.incumbent
        drift = identity_drift(ctx.world, inc, running=True, serving=True)
        if drift:
            return self.refuse(
                "the incumbent is not serving as recorded: "
                + "; ".join(d.describe(inc.container_id) for d in drift)
            )
        problems = route_problems(ctx.world, inc)
        if problems:
            return self.refuse("the tier does not route to the incumbent alone: " + "; ".join(problems))
        return None


class ServesFitTogether(Guard[Ctx]):
    """Both serves run at once, so together they fit the host's GPUs: no GPU role in common, or
    on each shared card both VRAM needs plus the reserve in force within its capacity."""

    def check(self, ctx: Ctx) -> Refusal | None:
        inc, cand = ctx.args.incumbent, ctx.args.candidate
        shared = sorted(set(inc.gpu_roles) & set(cand.gpu_roles))
        if not shared:
            return None
        need_inc, need_cand = ctx.args.vram_need_mib
        config = ctx.world.config
        reserves, waivers = reserve_in_force(ctx.world, shared, cand.recipe_digest)
        for role in shared:
            gpu = config.gpu_roles[role]
            reserve = reserves[role]
            if need_inc is None or need_cand is None:
                return self.refuse(
                    f"the two serves do not fit together: both use GPU role {role} and the VRAM need "
                    "of " + ("the incumbent" if need_inc is None else "the candidate") + " is not "
                    "known from its recipe (vram_need_mib)",
                    role=role,
                )
            total = need_inc + need_cand + reserve
            if total > gpu.capacity_mib:
                return self.refuse(
                    f"the two serves do not fit together on GPU role {role}: {need_inc} + {need_cand} "
                    f"MiB + reserve {reserve} MiB = {total} MiB > capacity {gpu.capacity_mib} MiB",
                    role=role,
                    need_mib=total,
                    capacity_mib=gpu.capacity_mib,
                    waivers=waivers,
                )
        return None


GUARDS: list[Guard[Ctx]] = [
    RouterConfigured(),
    RouterWeighs(),
    ApproverNamed(),
    CandidateVerified(),
    CandidateIsServing(),
    ServesFitTogether(),
    NoUnresolvedTransaction(),
    IncumbentServesTheTier(),
    RouterCredentialsAccepted(),
]


def declare(ctx: Ctx) -> StepResult:
    from anvil_ctl.qualify.canary import policy_from_json, policy_to_json

    args, world = ctx.args, ctx.world
    return {
        "shares": list(args.shares),
        "step_watch_s": args.step_watch_s,
        "profile": args.profile,
        "watch": policy_to_json(policy_from_json(args.watch)),
        "incumbent": {"container_id": args.incumbent.container_id, "url": _url(world, args.incumbent)},
        "candidate": {"container_id": args.candidate.container_id, "url": _url(world, args.candidate)},
        "tier": _tier(world, args.incumbent),
    }


def admit_candidate(ctx: Ctx) -> StepResult:
    world, cand = ctx.world, ctx.args.candidate
    router = router_of(world)  # RouterConfigured refused a host without one
    tier = _tier(world, ctx.args.incumbent)
    _weighted(world).set_weights(tier, {_url(world, ctx.args.incumbent): 100})
    router.register(tier, _url(world, cand), world.config.slot(cand.slot).aliases)
    return _set_share(world, ctx.args, 0)


def _router_idle(world: World, tier: str, url: str, deadline_s: float) -> float:
    """Seconds until the router counts nothing in flight to `url` (at most `deadline_s`): a
    request routed just before the weight went to 0 may not show in the engine's gauge yet."""
    router, started = world.router, world.clock.now()
    pause = pauses(world.config.policy.health_poll_s)
    while router is not None and (router.in_flight(tier, url) or 0) > 0:
        if world.clock.now() - started >= deadline_s:
            break
        world.clock.sleep(next(pause))
    return round(world.clock.now() - started, 3)


def all_to_incumbent(ctx: Ctx, _r: StepResult) -> StepResult:
    """Every new request to the incumbent; the candidate drained, stopped and retained."""
    world, args = ctx.world, ctx.args
    try:
        weights = _set_share(world, args, 0)
    except AdapterError:
        inc = _url(world, args.incumbent)
        _weighted(world).set_weights(_tier(world, args.incumbent), {inc: 100})
        weights = {"share": 0, "weights": {inc: 100}}
    stopped: JSONObject | None = None
    if is_running(world, args.candidate.container_id):
        tier, url = _tier(world, args.incumbent), _url(world, args.candidate)
        weights["router_idle_s"] = _router_idle(world, tier, url, args.drain.deadline_s)
        stopped = stop_drained(world, args.candidate, args.drain)
    if world.router is not None:
        world.router.deregister(_tier(world, args.incumbent), _url(world, args.candidate))
    return {**weights, "candidate_stopped": stopped}


def share_step(share: int) -> Step[Ctx]:
    def do(ctx: Ctx) -> StepResult:
        from anvil_ctl.engine.watch import Interrupts, watch
        from anvil_ctl.qualify.canary import SideBySide, judge, policy_from_json, summary
        from anvil_ctl.qualify.slosample import open_client

        world, args = ctx.world, ctx.args
        set_to = _set_share(world, args, share)
        arms = {"incumbent": args.incumbent, "candidate": args.candidate}
        policy = policy_from_json(args.watch)
        world.progress.waiting(
            f"the canary at {share} % (both serves sampled side by side)", args.step_watch_s
        )
        rounds: list[JSONObject] = []
        with contextlib.ExitStack() as opened, Interrupts().installed() as interrupts:
            clients = {
                a: opened.enter_context(open_client(_url(world, i), "anvil-canary")) for a, i in arms.items()
            }
            verdict = watch(
                duration_s=args.step_watch_s,
                interval_s=policy.interval_s,
                consecutive=policy.consecutive,
                judge=lambda kept: judge(policy, kept),
                take=SideBySide(clients, {a: i.served_model for a, i in arms.items()}, policy),
                record=lambda r: rounds.append(dict(r)),
                stop=lambda: interrupts.caught,
                at_least=policy.consecutive,  # so a breach can show in every step
                clock=world.clock.now,
                sleep=world.clock.sleep,
            )
        observed: JSONArray = [*rounds]
        if not verdict.healthy:
            named = "; ".join(
                f"{b['metric']} ({b['source']}) failed in {len(b['rounds'])} rounds in a row"  # type: ignore[arg-type]
                for b in verdict.breaches
            )
            who = verdict.stopped_by
            what = f"stopped at {share} % by {who.get('via')}" if who else f"breach at {share} %: {named}"
            raise StepFailed(
                f"canary {what}; every request goes back to the incumbent",
                share=share,
                samples=summary(rounds),
                breaches=[*verdict.breaches],
                stopped_by=who,
                rounds=observed,
            )
        return {**set_to, "verdict": "healthy", "samples": summary(rounds), "rounds": observed}

    return Step(f"share-{share}", do, None, f"the candidate takes {share} % of new requests; watched")


def _candidate(ctx: Ctx) -> Identity:
    return ctx.args.candidate


def cutover(ctx: Ctx) -> StepResult:
    """Wait until the incumbent answers nothing, then leave the candidate alone in the tier."""
    world, inc = ctx.world, ctx.args.incumbent
    short = f"{inc.container_id[:12]} ({inc.served_model})"
    drained = wait_idle(world, inc.slot, inc.engine_profile, short, ctx.args.drain)
    return {**route_slot_to(world, ctx.args.candidate), "incumbent_drain": drained}


def prepare(world: World, req: CanaryRequest) -> CanaryArgs:
    """The slot's loaded candidate, the incumbent serving its tier, the decision, the watch."""
    from anvil_ctl.qualify.canary import policy_to_json
    from anvil_ctl.qualify.profiles import load_profile
    from anvil_ctl.qualify.watchpolicy import DEFAULT

    store = world.store
    slot = world.config.slot(req.slot)
    cand = store.current_identity(req.slot, "candidate")
    if cand is None:
        raise BadInput(f"slot {req.slot}: no candidate has been loaded", field="candidate")
    inc = tier_incumbent(world, req.slot)
    if inc is None:
        raise BadInput(
            f"--canary: no other slot of router tier {slot.router_tier} has a running incumbent; a "
            "canary runs the candidate beside the incumbent, so the candidate is loaded in a second "
            "slot of the incumbent's tier (its own binding)",
            field="canary",
        )
    decision = standing_decision(store, cand.qualification_digest)
    profile = req.profile or (decision["profile"] if decision else None)
    return CanaryArgs(
        slot=req.slot,
        candidate=cand,
        incumbent=inc,
        decision_id=str(decision["id"]) if decision else None,
        decision_outcome=str(decision["outcome"]) if decision else None,
        approved_by=req.approved_by,
        shares=req.shares,
        step_watch_s=req.step_watch_s,
        watch=policy_to_json(load_profile(profile).watch if profile else DEFAULT),
        profile=profile,
        vram_need_mib=req.vram_need_mib,
    )


def build(args: CanaryArgs, world: World, _req: object = None) -> Plan[CanaryArgs, World, NoMemo]:
    steps: list[Step[Ctx]] = [
        Step("declare", declare, None, "journal the shares, the step watch and the thresholds"),
        Step(
            "admit-candidate",
            admit_candidate,
            all_to_incumbent,
            "register the candidate in the tier at weight 0 beside the incumbent",
        ),
        *(share_step(share) for share in args.shares),
        Step(
            "route-to-candidate",
            cutover,
            lambda ctx, _r: route_slot_to(ctx.world, ctx.args.incumbent),
            "the incumbent drained; the candidate alone in the tier",
        ),
        stop_retain_step(
            "stop-incumbent", lambda ctx: ctx.args.incumbent, "stop (never remove) the incumbent"
        ),
        smoke_step(_candidate),
        *closing_steps(),
    ]
    slots: Mapping[str, None] = dict.fromkeys(sorted({args.incumbent.slot, args.candidate.slot}))
    return Plan(
        kind="canary",
        args=args,
        steps=steps,
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, list(slots)),
        pivot="route-to-candidate",
        goal=lambda ctx: route_problems(ctx.world, ctx.args.candidate),
        repair=reroute(_candidate),
    )
