"""Observe the live placement into a canonical Snapshot (read-only); fluctuating readings stay
out.
"""

from __future__ import annotations

from typing import TypedDict

from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.core.errors import AdapterError, NotFound
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE, LABEL_SERVED_MODEL, LABEL_SLOT
from anvil_ctl.core.snapshot import Snapshot
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import gpu_ledger


def _container(world: World, container_id: str) -> JSONObject:
    try:
        c = world.runtime.inspect(container_id)
    except NotFound:
        return {"id": container_id, "status": "absent"}
    return {
        "id": c.id,
        "name": c.name,
        "status": c.status,
        "image_id": c.image_id,
        "fingerprint": c.fingerprint,
        "managed": c.managed,
        "role": c.labels.get(LABEL_ROLE),
        "served_model": c.labels.get(LABEL_SERVED_MODEL),
        "gpu_uuids": list(sorted(c.gpu_uuids)),
    }


class Serving(TypedDict):
    """What a binding serves: whether it answers, is healthy, and (model, max_model_len) pairs."""

    answering: bool
    healthy: bool
    models: list[tuple[str, int | None]]


def serving(world: World, base_url: str, health_path: str | None = "/health") -> Serving:
    """What the binding serves; without a health route, answering with a model list is healthy."""
    try:
        models = world.server.models(base_url)
        healthy = world.server.health(base_url, health_path) if health_path else bool(models)
    except AdapterError:
        return {"answering": False, "healthy": False, "models": []}
    return {
        "answering": bool(models),
        "healthy": healthy,
        "models": sorted({m.id: m.max_model_len for m in models}.items()),
    }


def router_view(world: World, tier: str) -> JSONObject:
    if world.router is None:
        return {"configured": False}
    try:
        return world.router.view(tier)
    except AdapterError as exc:
        return {"tier": tier, "error": type(exc).__name__}


def observe(world: World, slots: list[str] | None = None) -> Snapshot:
    observed: dict[str, object] = {}
    body: dict[str, object] = {"host": world.config.host, "slots": observed}
    for name in slots if slots is not None else sorted(world.config.slots):
        slot = world.config.slot(name)
        incumbent = world.store.current_identity(name, "incumbent")
        managed = world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: name})
        running = {c.id for c in managed if c.running}
        serve = next(
            (
                ident
                for ident in (incumbent, world.store.current_identity(name, "candidate"))
                if ident is not None and ident.container_id in running
            ),
            incumbent,
        )
        health_path = engine_profile(serve.engine_profile).health_path if serve else "/health"
        ids = {c.id for c in managed}
        if incumbent:
            ids.add(incumbent.container_id)
        observed[name] = {
            "binding": slot.binding,
            "incumbent": {
                "identity_digest": incumbent.digest if incumbent else None,
                "container_id": incumbent.container_id if incumbent else None,
                "served_model": incumbent.served_model if incumbent else None,
            },
            "containers": {cid: _container(world, cid) for cid in sorted(ids)},
            "serving": serving(world, slot.base_url, health_path),
            "router": router_view(world, slot.router_tier),
        }
    # Only who owns which role and how: times and transaction IDs would make equal placements differ.
    body["gpu_owners"] = {
        role: {"container_id": o.get("container_id"), "mode": o.get("mode")}
        for role, o in gpu_ledger.gpu_owners(world.store).items()
    }
    body["shm_residue"] = sorted(r.path for r in world.shm.residue()) if world.shm else []
    return Snapshot.of(body)
