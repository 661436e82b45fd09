"""Operations on serves that several transaction kinds share, each verifying the world.

Stopping returns only when the runtime reports the container exited; starting a
retained serve checks its image and fingerprint first and returns only when the
binding answers healthy with the exact served model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from anvil_ctl.core.errors import AdapterError, NotFound, StepFailed
from anvil_ctl.core.model import ContainerSpec, Identity, Mount
from anvil_ctl.engine.world import World


@dataclass(frozen=True)
class Candidate:
    """What `load` needs of a recipe, in a form that survives the journal."""

    recipe: str
    recipe_digest: str
    served_model: str
    context_tokens: int
    health_path: str
    startup_timeout_s: float
    spec: ContainerSpec
    gpu_roles: tuple[str, ...] = ()
    model_identity: str = ""
    max_concurrency: int = 1
    vram_need_mib: int = 0  # per card; the VRAM-release gate waits for this plus the reserve

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        s = dict(data["spec"])
        spec = ContainerSpec(
            name=s["name"],
            image=s["image"],
            command=tuple(s["command"]),
            entrypoint=tuple(s["entrypoint"]) if s.get("entrypoint") is not None else None,
            env=tuple((k, v) for k, v in s["env"]),
            labels=tuple((k, v) for k, v in s["labels"]),
            mounts=tuple(Mount(**m) for m in s["mounts"]),
            network_mode=s["network_mode"],
            ports=tuple((p, h) for p, h in s["ports"]),
            gpu_uuids=tuple(s["gpu_uuids"]),
            shm_size=s.get("shm_size"),
            ipc_mode=s.get("ipc_mode"),
            ulimits=tuple((n, a, b) for n, a, b in s["ulimits"]),
            init=s.get("init", True),
            working_dir=s.get("working_dir"),
        )
        fields = {k: v for k, v in data.items() if k != "spec"}
        fields["gpu_roles"] = tuple(fields.get("gpu_roles", ()))
        return cls(spec=spec, **fields)


def stop_verified(world: World, container_id: str) -> dict[str, Any]:
    """Stop a container and prove it exited; absent counts as a failure (nothing to retain)."""
    world.runtime.stop(container_id, world.config.policy.stop_timeout_s)
    info = world.runtime.inspect(container_id)
    if info.running:
        raise StepFailed(f"container {container_id} still running after stop", container_id=container_id)
    return {"container_id": container_id, "status": info.status}


def wait_serving(
    world: World, base_url: str, health_path: str, served_model: str, timeout_s: float
) -> dict[str, Any]:
    """Wait until health is 200 and /v1/models names exactly served_model."""
    deadline = world.clock.now() + timeout_s
    last: dict[str, Any] = {"healthy": False, "models": []}
    while True:
        try:
            healthy = world.engine.health(base_url, health_path)
            models = [m.id for m in world.engine.models(base_url)] if healthy else []
            last = {"healthy": healthy, "models": models}
            if healthy and models == [served_model]:
                return {"healthy": True, "served_model": served_model, "url": base_url}
        except AdapterError as exc:
            last = {"healthy": False, "error": str(exc)}
        if world.clock.now() >= deadline:
            raise StepFailed(
                f"{base_url} did not serve {served_model!r} within {timeout_s:.0f}s (last: {last})",
                last=last,
            )
        world.clock.sleep(world.config.policy.health_poll_s)


def restart_retained(world: World, identity: Identity, timeout_s: float = 300.0) -> dict[str, Any]:
    """Start the same container ID after verifying image and fingerprint; wait for its identity."""
    info = world.runtime.inspect(identity.container_id)
    if info.image_id != identity.image_id or info.fingerprint != identity.config_fingerprint:
        raise StepFailed(
            f"retained container {identity.container_id} drifted (image or config fingerprint)",
            observed_image=info.image_id,
            observed_fingerprint=info.fingerprint,
        )
    if not info.running:
        world.runtime.start(identity.container_id)
    slot = world.config.slot(identity.slot)
    served = wait_serving(world, slot.base_url, "/health", identity.served_model, timeout_s)
    return {"container_id": identity.container_id, **served}


def container_absent_or_stopped(world: World, container_id: str) -> bool:
    try:
        return not world.runtime.inspect(container_id).running
    except NotFound:
        return True


def route_slot_to(world: World, ident: Identity) -> dict[str, Any]:
    """Readmit the slot's router tier to the serve `ident` describes (verified by routed chat)."""
    assert world.router is not None
    slot = world.config.slot(ident.slot)
    world.router.readmit(
        slot.router_tier,
        slot.base_url,
        slot.aliases,
        ident.served_model,
        world.config.router.readmit_deadline_s,
    )
    return {"tier": slot.router_tier, "routed_to": ident.served_model}


def routed_smoke(world: World, ident: Identity) -> dict[str, Any]:
    """One authenticated routed chat by the slot's first alias must answer 200 from `ident`."""
    assert world.router is not None
    alias = world.config.slot(ident.slot).aliases[0]
    answer = world.router.routed_chat(alias)
    if answer.status != 200 or answer.model != ident.served_model:
        raise StepFailed(
            f"routed smoke to {alias}: HTTP {answer.status} from {answer.model!r}, "
            f"expected 200 from {ident.served_model!r}"
        )
    return {"alias": alias, "status": answer.status, "model": answer.model}
