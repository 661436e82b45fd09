"""Never dark: the serve a slot served with when a mutating transaction began is its safe
harbour, which `ensure_serving` brings back before any end state but `committed`. It never stops
a healthy, routed serve, and a route the router refused to show us is no reason to act.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from anvil_ctl.core.errors import AdapterError, AnvilError, AuthRejected
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT, VramNeed
from anvil_ctl.core.steps import Hold
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.serving import (
    inspect_or_none,
    is_running,
    restart_retained,
    route_slot_to,
    routed_smoke,
    served_models,
    stop_verified,
)
from anvil_ctl.engine.world import World
from anvil_ctl.log import get_logger

log = get_logger("anvil.availability")

RECORDED_ROLES = ("incumbent", "candidate", "rollback", "harbour")


@dataclass(frozen=True)
class SlotState:
    """What a slot serves right now, directly and through the router."""

    slot: str
    models: tuple[str, ...]
    routed_model: str | None
    """The model a routed chat answered 200 from; None if it did not (or no router)."""
    router: bool
    refused: str | None = None
    """Why the routed chat could not be sent: the router refused our credentials."""

    @property
    def answering(self) -> bool:
        return len(self.models) == 1

    @property
    def serving(self) -> bool:
        if not self.answering:
            return False
        return not self.router or self.routed_model == self.models[0]

    def as_dict(self) -> JSONObject:
        data: JSONObject = {**asdict(self), "models": list(self.models), "serving": self.serving}
        return data if self.refused else {k: v for k, v in data.items() if k != "refused"}


def observe_slot(world: World, slot: str) -> SlotState:
    try:
        models = tuple(served_models(world, slot))
    except AdapterError:
        models = ()
    routed: str | None = None
    refused: str | None = None
    if world.router is not None and models:
        try:
            answer = world.router.routed_chat(world.config.slot(slot).aliases[0])
            routed = answer.model if answer.status == 200 else None
        except AuthRejected as exc:
            refused = str(exc)
        except AnvilError:
            routed = None
    return SlotState(slot, models, routed, world.router is not None, refused)


def serving_identity(world: World, state: SlotState) -> Identity | None:
    """The recorded serve that answers at the slot's binding now (running, same model)."""
    if not state.answering:
        return None
    for role in RECORDED_ROLES:
        ident = world.store.current_identity(state.slot, role)
        if ident and ident.served_model == state.models[0] and is_running(world, ident.container_id):
            return ident
    return None


def record_harbour(world: World, tx_id: str, state: SlotState, hold: Hold) -> Identity | None:
    """Record the serving identity as the slot's safe harbour (when new), through `hold`."""
    if not state.serving:
        return None
    ident = serving_identity(world, state)
    if ident is None:
        return None
    current = world.store.current_identity(state.slot, "harbour")
    if current is None or current.digest != ident.digest:
        hold(lambda: world.store.record_identity(tx_id, "harbour", ident))
    return ident


def ensure_serving(world: World, tx_id: str, slot: str) -> JSONObject:
    """Make the slot serve again: re-route what answers, else bring the harbour back."""
    state = observe_slot(world, slot)
    if state.serving:
        return {"action": "none", "state": state.as_dict()}
    if state.refused:
        # Every re-route would be refused too, and bringing the harbour back would stop a
        # serve that may well be healthy and routed: nothing is touched.
        return {"action": "none", "unobserved": state.refused, "state": state.as_dict()}
    answering = serving_identity(world, state)
    if answering is not None and world.router is not None:
        try:
            route_slot_to(world, answering, hold=True)
            routed_smoke(world, answering)
            return {"action": "rerouted", "container_id": answering.container_id}
        except AnvilError as exc:
            log.warning("availability.reroute_failed", slot=slot, error=str(exc))
    harbour = world.store.current_identity(slot, "harbour")
    if harbour is None:
        return {"action": "none", "problem": "no safe harbour recorded", "state": state.as_dict()}
    try:
        return {"action": "harbour", **bring_back(world, tx_id, harbour)}
    except AnvilError as exc:
        log.error("availability.harbour_failed", slot=slot, error=str(exc))
        return {"action": "harbour", "error": str(exc), "container_id": harbour.container_id}


def bring_back(world: World, tx_id: str, harbour: Identity) -> JSONObject:
    """Stop (retain) every other container of the slot, start the harbour, route it."""
    stopped = []
    slot_containers = world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: harbour.slot})
    others = {c.id for c in slot_containers if c.running} | {
        ident.container_id
        for role in RECORDED_ROLES
        if (ident := world.store.current_identity(harbour.slot, role)) is not None
    }
    for cid in sorted(others - {harbour.container_id}):
        info = inspect_or_none(world, cid)
        if info is not None and info.running:
            stop_verified(world, cid)
            stopped.append(cid)
    release = None
    if not is_running(world, harbour.container_id) and world.vram_release is not None:
        release = world.vram_release(VramNeed(harbour.gpu_roles, 0, harbour.recipe_digest))
    started = restart_retained(world, harbour)
    owners = gpu_ownership.record_ownership(world, tx_id, harbour, None)
    routed = None
    if world.router is not None:
        route_slot_to(world, harbour, hold=True)
        routed = routed_smoke(world, harbour)
    log.warning("availability.harbour_restored", slot=harbour.slot, container_id=harbour.container_id)
    return {
        "container_id": harbour.container_id,
        "stopped": list(stopped),
        "vram_release": release,
        "started": started,
        "gpu": owners,
        "routed": routed,
    }
