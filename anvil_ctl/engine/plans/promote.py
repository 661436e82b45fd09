"""`promote`: route the slot's tier to a qualified candidate; it becomes the incumbent.

Refused before mutation unless the candidate has a `verified` decision for its
exact identity (or one reclassified under waivers that are all still active), the
candidate is the container serving the slot, the incumbent's rollback identity is
complete and restorable, the router accepts our credentials and an approver is
named. Steps: readmit the tier to the candidate (undo: drain it again); an
authenticated routed smoke; real-client acceptance with the `openai` client;
record the candidate as incumbent and the old incumbent as the rollback identity
with the approval (undo: record the old incumbent back).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from anvil_ctl.core.errors import NotFound, StepFailed
from anvil_ctl.core.guards import Guard, Refusal
from anvil_ctl.core.model import Identity
from anvil_ctl.core.steps import Plan, Step, StepContext, StepResult
from anvil_ctl.engine.guards import guards_for
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.serving import route_slot_to, routed_smoke
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import approvals, qualification, waivers


def _w(ctx: StepContext) -> World:
    world: World = ctx.world
    return world


def _ident(ctx: StepContext, key: str) -> Identity:
    return Identity.from_dict(ctx.args[key])


def standing_decision(world: World, identity_digest: str) -> dict[str, Any] | None:
    """The newest decision for this identity whose waivers (if any) are all still active."""
    now = datetime.now(UTC)
    active = {w.id for w in waivers.waivers(world.store) if w.active(now)}
    for d in reversed(qualification.decisions(world.store, identity_digest=identity_digest)):
        if all(wid in active for wid in d["waiver_ids"]):
            standing: dict[str, Any] = d
            return standing
    return None


class CandidateVerified(Guard):
    """The candidate's exact identity (its qualification digest) has a standing `verified` decision."""

    kinds: ClassVar[frozenset[str]] = frozenset({"promote"})

    def check(self, ctx: StepContext) -> Refusal | None:
        cand = _ident(ctx, "candidate")
        decision = standing_decision(_w(ctx), cand.qualification_digest)
        if decision is None:
            return self.refuse(
                f"no decision recorded for candidate identity {cand.qualification_digest[:12]} "
                f"({cand.served_model}); run `anvilctl qualify --slot {cand.slot}` first"
            )
        if decision["outcome"] != "verified":
            return self.refuse(
                f"candidate {cand.served_model} decision is {decision['outcome']} "
                f"(decision {decision['id'][:12]}); only a verified decision can be promoted",
                decision=decision["id"],
            )
        return None


class CandidateIsServing(Guard):
    """The candidate container runs with its recorded image and fingerprint and serves the slot."""

    kinds: ClassVar[frozenset[str]] = frozenset({"promote"})

    def check(self, ctx: StepContext) -> Refusal | None:
        world, cand = _w(ctx), _ident(ctx, "candidate")
        try:
            info = world.runtime.inspect(cand.container_id)
        except NotFound:
            return self.refuse(f"candidate container {cand.container_id[:12]} is gone")
        if not info.running:
            return self.refuse(f"candidate container {cand.container_id[:12]} is {info.status}")
        if info.image_id != cand.image_id or info.fingerprint != cand.config_fingerprint:
            return self.refuse(f"candidate container {cand.container_id[:12]} drifted from its identity")
        served = [m.id for m in world.engine.models(world.config.slot(cand.slot).base_url)]
        if served != [cand.served_model]:
            return self.refuse(f"slot serves {served}, not the candidate {cand.served_model!r}")
        return None


class RouterConfigured(Guard):
    """Promotion means routing: a host without a router has nothing to promote to."""

    kinds: ClassVar[frozenset[str]] = frozenset({"promote"})

    def check(self, ctx: StepContext) -> Refusal | None:
        if _w(ctx).router is None:
            return self.refuse("promote needs a router: the host config's router.kind is 'none'")
        return None


class ApproverNamed(Guard):
    """A promotion names the person who approved it."""

    kinds: ClassVar[frozenset[str]] = frozenset({"promote"})

    def check(self, ctx: StepContext) -> Refusal | None:
        if not str(ctx.args.get("approved_by") or "").strip():
            return self.refuse("--approved-by NAME is required for a promotion")
        return None


def route_to_candidate(ctx: StepContext) -> StepResult:
    return route_slot_to(_w(ctx), _ident(ctx, "candidate"))


def drain_again(ctx: StepContext, _r: StepResult) -> StepResult:
    world, cand = _w(ctx), _ident(ctx, "candidate")
    assert world.router is not None
    tier = world.config.slot(cand.slot).router_tier
    world.router.drain(tier)
    return {"tier": tier, "drained": True}


def smoke(ctx: StepContext) -> StepResult:
    return routed_smoke(_w(ctx), _ident(ctx, "candidate"))


def acceptance(ctx: StepContext) -> StepResult:
    world, cand = _w(ctx), _ident(ctx, "candidate")
    accept = world.extras.get("acceptance")
    if accept is None:
        raise StepFailed("no real-client acceptance is configured for this router")
    alias = world.config.slot(cand.slot).aliases[0]
    result = accept(alias, cand.served_model)
    data: dict[str, Any] = result.as_dict()
    if not result.passed:
        raise StepFailed(f"real-client acceptance failed: {data}", acceptance=data)
    return data


def record_promotion(ctx: StepContext) -> StepResult:
    world = _w(ctx)
    cand, old = _ident(ctx, "candidate"), _ident(ctx, "incumbent")
    world.store.record_identity(ctx.tx_id, "incumbent", cand)
    world.store.record_identity(ctx.tx_id, "rollback", old)
    approvals.record_approval(
        world.store,
        tx_id=ctx.tx_id,
        decision_id=ctx.args["decision_id"],
        approved_by=str(ctx.args["approved_by"]),
    )
    return {
        "incumbent": cand.container_id,
        "rollback": old.container_id,
        "approved_by": ctx.args["approved_by"],
        "decision_id": ctx.args["decision_id"],
    }


def unrecord_promotion(ctx: StepContext, _r: StepResult) -> StepResult:
    world, old = _w(ctx), _ident(ctx, "incumbent")
    world.store.record_identity(ctx.tx_id, "incumbent", old)
    return {"incumbent": old.container_id}


GUARDS = [RouterConfigured(), ApproverNamed(), CandidateVerified(), CandidateIsServing()]


def build(args: Mapping[str, Any], world: World) -> Plan:
    slot = str(args["slot"])
    return Plan(
        kind="promote",
        args=args,
        steps=[
            Step(
                "route-to-candidate",
                route_to_candidate,
                drain_again,
                "route the tier to the candidate",
            ),
            Step("routed-smoke", smoke, None, "authenticated routed chat by alias"),
            Step(
                "acceptance",
                acceptance,
                None,
                "real-client acceptance (openai: chat, stream, tool)",
            ),
            Step(
                "record-promotion",
                record_promotion,
                unrecord_promotion,
                "candidate becomes incumbent; old incumbent the rollback identity; approval",
            ),
        ],
        guards=[*GUARDS, *guards_for("promote")],
        slot=slot,
        snapshot=lambda: observe(world, [slot]),
    )
