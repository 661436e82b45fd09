"""Taking a serve out of traffic without cutting an answer: wait until nothing is in flight, then
stop. At the `DrainPolicy` deadline, `abort` raises `DrainRefused` (the plan compensates);
`cut` stops anyway and counts the answers cut.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.core.errors import AdapterError, DrainRefused
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import DrainPolicy
from anvil_ctl.core.steps import Step, StepContext, StepResult
from anvil_ctl.engine.serving import Which, drain_slot, pauses, restart_retained, route_slot_to, stop_verified
from anvil_ctl.engine.world import World
from anvil_ctl.log import get_logger

log = get_logger("anvil.drain")


class DrainArgs(Protocol):
    @property
    def slot(self) -> str: ...

    @property
    def drain(self) -> DrainPolicy: ...


D = TypeVar("D", bound=StepContext[DrainArgs, World, object])


@dataclass(frozen=True)
class InFlight:
    """Requests a serve is answering (None: no source can say) and where the count came from."""

    count: int | None
    source: str


def in_flight(world: World, slot_name: str, profile: str) -> InFlight:
    """What the serve at `slot_name`'s binding is answering now, from the most exact source."""
    slot = world.config.slot(slot_name)
    metric = engine_profile(profile).running_metric
    if metric:
        count = world.server.running(slot.base_url, metric)
        if count is not None:
            return InFlight(count, f"engine {metric}")
    if world.router is not None:
        count = world.router.in_flight(slot.router_tier, slot.base_url)
        if count is not None:
            return InFlight(count, "router")
    return InFlight(None, "none")


def wait_idle(world: World, slot: str, profile: str, short: str, policy: DrainPolicy) -> JSONObject:
    """Wait until the serve at `slot`'s binding (`short` names it) answers nothing, at most
    `policy.deadline_s`; what the drain saw, with the answers `cut` at the deadline."""
    world.progress.waiting(f"the answers in flight on {short} to finish", policy.deadline_s)
    started = world.clock.now()
    pause = pauses(world.config.policy.health_poll_s)
    first: InFlight | None = None
    while True:
        seen = in_flight(world, slot, profile)
        first = first or seen
        waited = round(world.clock.now() - started, 3)
        result: JSONObject = {
            "in_flight": first.count,
            "source": seen.source,
            "waited_s": waited,
            "deadline_s": policy.deadline_s,
            "cut": 0,
        }
        if not seen.count:
            return result
        if waited >= policy.deadline_s:
            if policy.on_timeout == "abort":
                raise DrainRefused(
                    f"{seen.count} answer(s) still in flight on {short} at the drain's "
                    f"{policy.deadline_s:g} s deadline (counted by the {seen.source}); refusing to cut "
                    "them: the serve is routed again. Retry later, or pass --drain-timeout SECONDS "
                    "or --on-drain-timeout cut",
                    in_flight=seen.count,
                    source=seen.source,
                    deadline_s=policy.deadline_s,
                )
            log.warning("drain.cut", serve=short, cut=seen.count, source=seen.source)
            world.progress.note(f"drain deadline: {seen.count} answer(s) in flight on {short} cut")
            return {**result, "cut": seen.count}
        world.clock.sleep(min(next(pause), max(policy.deadline_s - waited, 0.0)))


SWAP_HOLD_S = 3.0
"""How long a router may hold a new request for the serve this run routes next (`Router.drain`):
a swap of a quick engine ends within it and the request is answered by the new serve; a longer
one answers it 503 at this deadline, and every later one at once."""


def drain_step(
    readmit: Which[D],
    description: str = "quiesce the slot's router tier",
    *,
    routes_next: Callable[[D], bool] = lambda _ctx: False,
) -> Step[D]:
    """Drain the slot's tier; the undo routes it back to `readmit(ctx)` (if any). `routes_next`:
    this run routes a serve of the slot itself next, so the router may hold new requests for it."""

    def do(ctx: D) -> StepResult:
        serve, before = readmit(ctx), None
        if serve is not None:
            # Read once while the serve is still routed: the first read of a source loads its
            # parser, which would otherwise stall the stop's drain inside the clients' window.
            with contextlib.suppress(AdapterError):  # the stop's drain reads it again, and says
                before = in_flight(ctx.world, ctx.args.slot, serve.engine_profile)
        drained = drain_slot(ctx.world, ctx.args.slot, hold_s=SWAP_HOLD_S if routes_next(ctx) else 0.0)
        if before is None:
            return drained
        return {**drained, "in_flight_before": before.count, "source": before.source}

    def undo(ctx: D, _result: StepResult) -> StepResult:
        serve = readmit(ctx)
        return route_slot_to(ctx.world, serve) if serve is not None else {"readmitted": None}

    return Step("drain-tier", do, undo, description)


def stop_drained(world: World, ident: Identity, policy: DrainPolicy) -> JSONObject:
    """Wait for the answers in flight (`wait_idle`), then stop gracefully and prove it exited."""
    short = f"{ident.container_id[:12]} ({ident.served_model})"
    drained = wait_idle(world, ident.slot, ident.engine_profile, short, policy)
    stopped = stop_verified(world, ident.container_id, engine_profile(ident.engine_profile).stop_timeout_s)
    return {**stopped, "drain": drained}


def stop_retain_step(name: str, which: Which[D], description: str) -> Step[D]:
    """Drain and stop (never remove) `which(ctx)`; the undo starts the same container ID again."""

    def do(ctx: D) -> StepResult:
        serve = which(ctx)
        return stop_drained(ctx.world, serve, ctx.args.drain) if serve else {"stopped": None}

    def undo(ctx: D, _result: StepResult) -> StepResult:
        serve = which(ctx)
        return restart_retained(ctx.world, serve) if serve else {"restarted": None}

    return Step(name, do, undo, description)
