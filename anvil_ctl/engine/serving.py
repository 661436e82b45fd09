"""Operations on serves that several transaction kinds share, each verifying the world.
`identity_drift` is the one comparison of a recorded identity with the live container.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.core.errors import AdapterError, NotFound, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT, ContainerInfo, Readmission, VramNeed
from anvil_ctl.core.ports import Router
from anvil_ctl.core.steps import Step, StepContext, StepResult
from anvil_ctl.engine.world import World
from anvil_ctl.log import get_logger

log = get_logger("anvil.serving")


class SlotArgs(Protocol):
    @property
    def slot(self) -> str: ...


C = TypeVar("C", bound=StepContext[SlotArgs, World, object])
Which = Callable[[C], Identity | None]
"""Picks, from a step's context, the serve a shared step acts on (None: nothing to do)."""


@dataclass(frozen=True)
class FieldDrift:
    """One identity-critical field whose live value differs from the recorded one."""

    field: str
    recorded: JSONValue
    observed: JSONValue

    def describe(self, container_id: str) -> str:
        short = container_id[:12]
        if self.field == "container":
            return f"container {short} no longer exists"
        if self.field == "status":
            return f"container {short} is {self.observed}, not running"
        if self.field == "served_model":
            return f"binding serves {self.observed}, not [{self.recorded!r}]"
        return f"container {short} {self.field} drifted: recorded {self.recorded}, observed {self.observed}"

    def as_dict(self) -> JSONObject:
        return {"field": self.field, "recorded": self.recorded, "observed": self.observed}


def inspect_or_none(world: World, container_id: str) -> ContainerInfo | None:
    try:
        return world.runtime.inspect(container_id)
    except NotFound:
        return None


def identity_drift(
    world: World, ident: Identity, *, running: bool = False, serving: bool = False
) -> list[FieldDrift]:
    """Where the live container differs from `ident`: it exists (exact ID), same image ID and config
    fingerprint; with `running`, it runs; with `serving`, its binding serves `ident.served_model`."""
    info = inspect_or_none(world, ident.container_id)
    if info is None:
        return [FieldDrift("container", ident.container_id, None)]
    drift = []
    if running and not info.running:
        drift.append(FieldDrift("status", "running", info.status))
    if info.image_id != ident.image_id:
        drift.append(FieldDrift("image_id", ident.image_id, info.image_id))
    if info.fingerprint != ident.config_fingerprint:
        drift.append(FieldDrift("config_fingerprint", ident.config_fingerprint, info.fingerprint))
    if serving:
        served = served_models(world, ident.slot)
        if served != [ident.served_model]:
            drift.append(FieldDrift("served_model", ident.served_model, list(served)))
    return drift


def served_models(world: World, slot: str) -> list[str]:
    return sorted(m.id for m in world.server.models(world.config.slot(slot).base_url))


def serving_problems(world: World, ident: Identity) -> list[str]:
    """Why `ident` is not what its slot runs, alone, and serves right now (empty: it is)."""
    drift = identity_drift(world, ident, running=True)
    problems = [d.describe(ident.container_id) for d in drift]
    if any(d.field == "container" for d in drift):
        return problems
    labels = {LABEL_MANAGED: "true", LABEL_SLOT: ident.slot}
    others = [
        c.id[:12] for c in world.runtime.list(labels=labels) if c.running and c.id != ident.container_id
    ]
    if others:
        problems.append(f"other containers run for slot {ident.slot}: {', '.join(others)}")
    base_url = world.config.slot(ident.slot).base_url
    try:
        served = served_models(world, ident.slot)
    except AdapterError as exc:
        return [*problems, f"{base_url}/v1/models did not answer: {exc}"]
    if served != [ident.served_model]:
        problems.append(f"{base_url} serves {served}, expected [{ident.served_model!r}]")
    return problems


def image_present(world: World, image_id: str) -> bool:
    try:
        world.runtime.image(image_id)
    except NotFound:
        return False
    return True


def is_running(world: World, container_id: str) -> bool:
    info = inspect_or_none(world, container_id)
    return info is not None and info.running


def tier_incumbent(world: World, slot: str) -> Identity | None:
    """The running incumbent of another slot of `slot`'s router tier (a canary's pair)."""
    tier = world.config.slot(slot).router_tier
    for name, other in sorted(world.config.slots.items()):
        if name == slot or other.router_tier != tier:
            continue
        ident = world.store.current_identity(name, "incumbent")
        if ident is not None and is_running(world, ident.container_id):
            return ident
    return None


def stop_verified(world: World, container_id: str, grace: float | None = None) -> JSONObject:
    """Stop a container and prove it exited; absent counts as a failure (nothing to retain)."""
    grace = world.config.policy.stop_timeout_s if grace is None else grace
    world.progress.waiting(f"container {container_id[:12]} to stop (SIGKILL at the deadline)", grace)
    world.runtime.stop(container_id, grace)
    info = world.runtime.inspect(container_id)
    if info.running:
        raise StepFailed(f"container {container_id} still running after stop", container_id=container_id)
    return {"container_id": container_id, "status": info.status}


POLL_FIRST_S = 0.02
"""The first pause of a poll: short, since most waits end within a few and a poll is cheap."""
POLL_GROWTH = 1.25
"""Each pause a quarter longer than the last: a long wait polls ever less."""


def pauses(longest: float, first: float = POLL_FIRST_S) -> Iterator[float]:
    """Poll intervals: `first`, growing by `POLL_GROWTH` up to `longest` (`health_poll_s`)."""
    pause = min(first, longest)
    while True:
        yield pause
        pause = min(pause * POLL_GROWTH, longest)


def _observe_readiness(world: World, base_url: str, health_path: str | None) -> JSONObject:
    """One readiness poll: the health route (if any), the model list, whether anything listens."""
    if health_path is not None and not world.server.health(base_url, health_path):
        return {"healthy": False, "models": [], "listening": world.server.listening(base_url)}
    models: list[str] = [m.id for m in world.server.models(base_url)]
    listening = bool(models) or world.server.listening(base_url)
    return {"healthy": listening, "models": list(models), "listening": listening}


def wait_serving(
    world: World,
    base_url: str,
    health_path: str | None,
    served_model: str,
    timeout_s: float,
) -> JSONObject:
    """Wait until the health route (if any) is 200 and /v1/models names exactly `served_model`."""
    timeout_s = world.wait(f"{base_url} to serve {served_model}", timeout_s)
    deadline = world.clock.now() + timeout_s
    started = world.clock.now()
    last: JSONObject = {"healthy": False, "models": []}
    first: JSONObject | None = None
    polls = 0
    pause = pauses(world.config.policy.health_poll_s)
    while True:
        polls += 1
        try:
            last = _observe_readiness(world, base_url, health_path)
        except AdapterError as exc:
            last = {"healthy": False, "error": str(exc)}
        first = first or last
        if last.get("healthy") and last.get("models") == [served_model]:
            return {
                "healthy": True,
                "served_model": served_model,
                "url": base_url,
                "health_path": health_path,
                "polls": polls,
                "first_poll": first,
                "waited_s": round(world.clock.now() - started, 3),
            }
        if world.clock.now() >= deadline:
            raise StepFailed(
                f"{base_url} did not serve {served_model!r} within {timeout_s:.0f}s (last: {last})",
                last=last,
                polls=polls,
            )
        world.clock.sleep(next(pause))


def restart_retained(world: World, identity: Identity, timeout_s: float = 300.0) -> JSONObject:
    """Start the same container ID after verifying its identity; wait for its served model."""
    drift = identity_drift(world, identity)
    if drift:
        raise StepFailed(
            f"retained container {identity.container_id} drifted: "
            + "; ".join(d.describe(identity.container_id) for d in drift),
            drift=[d.as_dict() for d in drift],
        )
    if not is_running(world, identity.container_id):
        world.runtime.start(identity.container_id)
    slot = world.config.slot(identity.slot)
    health = engine_profile(identity.engine_profile).health_path
    served = wait_serving(world, slot.base_url, health, identity.served_model, timeout_s)
    return {"container_id": identity.container_id, **served}


def routed_expectation(world: World, ident: Identity) -> tuple[str, str]:
    """(alias, the `model` a routed answer by it must carry) for `ident`'s slot."""
    alias = world.config.slot(ident.slot).aliases[0]
    return alias, engine_profile(ident.engine_profile).routed_model(ident.served_model, alias)


def routed_chain_problems(world: World, ident: Identity) -> list[str]:
    """For an engine whose answers echo the request's model, the routed identity is a chain:
    the tier routes to the slot's binding and the binding serves `ident.served_model`."""
    if engine_profile(ident.engine_profile).response_model == "served" or world.router is None:
        return []
    slot = world.config.slot(ident.slot)
    problems = []
    backends = world.router.view(slot.router_tier).get("backends", [])
    urls = [b.get("url") for b in backends if isinstance(b, dict)] if isinstance(backends, list) else []
    if urls != [slot.base_url]:
        problems.append(f"router tier {slot.router_tier} routes to {urls}, not [{slot.base_url}]")
    served = served_models(world, ident.slot)
    if served != [ident.served_model]:
        problems.append(f"{slot.base_url} serves {served}, not [{ident.served_model!r}]")
    return problems


def route_slot_to(world: World, ident: Identity, *, hold: bool = False) -> JSONObject:
    """Readmit the slot's router tier to the serve `ident` describes (verified by routed chat);
    `hold` (or `world.hold_readmissions`): hold past a removal this process did not send."""
    router = router_of(world)
    slot = world.config.slot(ident.slot)
    _alias, expected = routed_expectation(world, ident)
    deadline_s = world.wait(
        f"router tier {slot.router_tier} to readmit {slot.base_url} as {expected}",
        world.config.router.readmit_deadline_s,
    )
    hold = hold or world.hold_readmissions
    router.readmit(
        Readmission(slot.router_tier, slot.base_url, slot.aliases, expected, deadline_s, hold=hold)
    )
    chain = routed_chain_problems(world, ident)
    if chain:
        raise StepFailed("routed identity not verified: " + "; ".join(chain), problems=chain)
    return {"tier": slot.router_tier, "routed_to": ident.served_model, "answer_model": expected}


def routed_smoke(world: World, ident: Identity) -> JSONObject:
    """One authenticated routed chat by the slot's first alias must answer 200 from `ident`."""
    router = router_of(world)
    alias, expected = routed_expectation(world, ident)
    answer = router.routed_chat(alias)
    if answer.status != 200 or answer.model != expected:
        raise StepFailed(
            f"routed smoke to {alias}: HTTP {answer.status} from {answer.model!r}, "
            f"expected 200 from {expected!r}"
        )
    chain = routed_chain_problems(world, ident)
    if chain:
        raise StepFailed(f"routed smoke to {alias}: " + "; ".join(chain), problems=chain)
    return {
        "alias": alias,
        "status": answer.status,
        "model": answer.model,
        "served_model": ident.served_model,
    }


def route_problems(world: World, ident: Identity) -> list[str]:
    """Why the slot's tier does not route to `ident` now (empty: it does, verified by a chat)."""
    if world.router is None:
        return []
    slot = world.config.slot(ident.slot)
    _alias, expected = routed_expectation(world, ident)
    check = world.router.check_route(slot.router_tier, slot.base_url, expected)
    problems = [] if check.holds else [f"router tier {slot.router_tier}: {check.reason}"]
    # An engine that echoes the request's model: the answer alone does not say which serve
    # answered, so the chain (tier -> binding -> served name) is checked too.
    return problems + [p for p in routed_chain_problems(world, ident) if "routes to" not in p]


def drain_slot(world: World, slot: str, *, hold_s: float = 0.0) -> JSONObject:
    tier = world.config.slot(slot).router_tier
    router = router_of(world)
    # The router adapter enforces this deadline itself (smg's removal wait); --timeout does not cut it.
    world.progress.waiting(f"router tier {tier} to drain", world.config.router.drain_deadline_s)
    router.drain(tier, hold_s=hold_s)
    return {"tier": tier, "hold_s": hold_s} if hold_s else {"tier": tier}


def router_of(world: World) -> Router:
    """The world's router (StepFailed where none is configured: guards refuse that first)."""
    if world.router is None:
        raise StepFailed("this step needs a router: the host config's router.kind is 'none'")
    return world.router


def release_vram_step(need: Callable[[C], VramNeed]) -> Step[C]:
    """Wait until the GPUs the next serve uses have its need plus the reserve free."""

    def do(ctx: C) -> StepResult:
        gate = ctx.world.vram_release
        if gate is None:
            return {"skipped": "no GPU probe configured"}
        return gate(need(ctx))

    return Step("release-vram", do, None, "wait until the GPUs' memory is observed free")


def reroute(which: Callable[[C], Identity]) -> Callable[[C], None]:
    """A goal's repair: route the tier to `which(ctx)` again, holding past a pending removal."""

    def repair(ctx: C) -> None:
        route_slot_to(ctx.world, which(ctx), hold=True)

    return repair


def route_step(
    name: str,
    which: Callable[[C], Identity],
    description: str,
    undo: Callable[[C, StepResult], StepResult] | None = None,
) -> Step[C]:
    """Route the slot's tier to `which(ctx)` and readmit it (each plan says how to undo it)."""

    def do(ctx: C) -> StepResult:
        return route_slot_to(ctx.world, which(ctx))

    return Step(name, do, undo, description)


def through_the_route(world: World, ident: Identity, call: Callable[[], StepResult]) -> StepResult:
    """Run a check through the router; when the route itself is gone, put it back once and retry."""
    try:
        return call()
    except StepFailed as first:
        if not route_problems(world, ident):
            raise
        log.warning("route lost during the transaction: re-applying it once", error=str(first))
        route_slot_to(world, ident)
        result = call()
        return {**(result or {}), "route_reapplied": str(first)}


def smoke_step(which: Callable[[C], Identity]) -> Step[C]:
    def do(ctx: C) -> StepResult:
        ident = which(ctx)
        return through_the_route(ctx.world, ident, lambda: routed_smoke(ctx.world, ident))

    return Step("routed-smoke", do, None, "authenticated routed chat by alias")
