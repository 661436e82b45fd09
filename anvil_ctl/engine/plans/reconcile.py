"""`reconcile`: re-apply a slot's recorded route after a router restart or a late removal; a
candidate `load` left unpromoted is never published. Nothing to undo.
"""

from __future__ import annotations

from anvil_ctl.core.errors import AdapterError, BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_SLOT
from anvil_ctl.core.steps import Guard, NoMemo, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine.guards import NoUnresolvedTransaction, RouterConfigured, RouterCredentialsAccepted
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import ReconcileArgs, ReconcileRequest
from anvil_ctl.engine.serving import (
    identity_drift,
    is_running,
    route_slot_to,
    routed_expectation,
    router_of,
    smoke_step,
)
from anvil_ctl.engine.world import World

Ctx = StepContext[ReconcileArgs, World, NoMemo]

HEALTH_PATH = "/health"
"""Where the recorded serve's health is read (as `restart_retained` and `recheck` do)."""


def what_runs(world: World, slot_name: str, serve: Identity) -> str:
    """What serves the slot instead of its recorded serve, for a refusal a person can act on."""
    slot = world.config.slot(slot_name)
    cand = world.store.current_identity(slot_name, "candidate")
    if cand is not None and cand.container_id != serve.container_id and is_running(world, cand.container_id):
        return (
            f"the slot runs the loaded candidate {cand.container_id[:12]} ({cand.served_model}), "
            "which is not promoted: its tier stays unrouted until `anvilctl promote` publishes it "
            "or `anvilctl rollback` restores the incumbent"
        )
    running = [c for c in world.runtime.list(labels={LABEL_SLOT: slot_name}) if c.running]
    if running:
        return "running for the slot: " + ", ".join(f"{c.id[:12]} ({c.name})" for c in running)
    try:
        served = sorted(m.id for m in world.server.models(slot.base_url))
    except AdapterError as exc:
        return f"{slot.binding} does not answer as an OpenAI endpoint ({exc})"
    if served:
        return f"{slot.binding} serves {served} from no container we recorded"
    return f"nothing we recorded runs for the slot and {slot.binding} serves nothing"


class RecordedServeRunning(Guard[Ctx]):
    """The serve the slot's record publishes runs as recorded and its binding answers healthy
    with exactly its served model: only then does routing the binding route that serve."""

    def check(self, ctx: Ctx) -> Refusal | None:
        world, serve = ctx.world, ctx.args.serve
        short = f"{serve.container_id[:12]} ({serve.served_model})"
        drift = {d.field: d for d in identity_drift(world, serve, running=True)}
        if "container" in drift:
            return self.refuse(
                f"recorded serve {short} no longer exists; {what_runs(world, serve.slot, serve)}",
                container_id=serve.container_id,
            )
        if "status" in drift:
            return self.refuse(
                f"recorded serve {short} is {drift['status'].observed}, not running; "
                f"{what_runs(world, serve.slot, serve)}",
                container_id=serve.container_id,
            )
        if drift:
            return self.refuse(
                f"recorded serve {short} drifted from its identity: "
                + "; ".join(d.describe(serve.container_id) for d in drift.values()),
                drift=[d.as_dict() for d in drift.values()],
            )
        slot = world.config.slot(serve.slot)
        try:
            served = sorted(m.id for m in world.server.models(slot.base_url))
            healthy = world.server.health(slot.base_url, HEALTH_PATH)
        except AdapterError as exc:
            return self.refuse(f"{slot.binding} does not answer for {short}: {exc}")
        if served != [serve.served_model]:
            return self.refuse(
                f"{slot.binding} serves {served}, not the recorded serve {short}; "
                f"{what_runs(world, serve.slot, serve)}"
            )
        if not healthy:
            return self.refuse(f"recorded serve {short} runs but {slot.base_url}{HEALTH_PATH} is not healthy")
        return None


GUARDS: list[Guard[Ctx]] = [
    RouterConfigured(),
    RecordedServeRunning(),
    NoUnresolvedTransaction(),
    RouterCredentialsAccepted(),
]


def route_slot(ctx: Ctx) -> StepResult:
    """Observe the route; re-apply it only when it does not hold."""
    world, serve = ctx.world, ctx.args.serve
    slot = world.config.slot(serve.slot)
    _alias, expected = routed_expectation(world, serve)
    before = router_of(world).check_route(slot.router_tier, slot.base_url, expected)
    result: JSONObject = {"tier": slot.router_tier, "url": slot.base_url, "model": serve.served_model}
    if before.holds:
        return {**result, "already_routed": True, "changed": False}
    # Whatever broke the route (a restart, someone's DELETE) may have left a removal pending.
    routed = route_slot_to(world, serve, hold=True)
    return {**result, **routed, "already_routed": False, "changed": True, "was": before.reason}


def prepare(world: World, req: ReconcileRequest) -> ReconcileArgs:
    """The serve the slot's record publishes: its incumbent (BadInput where none is recorded)."""
    world.config.slot(req.slot)
    serve = world.store.current_identity(req.slot, "incumbent")
    if serve is None:
        raise BadInput(
            f"slot {req.slot}: no incumbent is recorded, so no route to re-apply; "
            "adopt the serving container first (`anvilctl adopt`)",
            field="slot",
        )
    return ReconcileArgs(slot=req.slot, serve=serve)


def build(args: ReconcileArgs, world: World, _req: object = None) -> Plan[ReconcileArgs, World, NoMemo]:
    return Plan(
        kind="reconcile",
        args=args,
        steps=[
            Step(
                "route-slot",
                route_slot,
                None,
                "observe the tier's route; re-apply it to the recorded serve unless it holds",
            ),
            smoke_step(lambda ctx: ctx.args.serve),
        ],
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        pivot="route-slot",
    )
