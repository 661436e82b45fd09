"""Real adapters for the World: Docker, the configured router, NVML or simulated GPUs.

A router whose credentials cannot be resolved is still wired, as a router that
refuses every call naming the credential sources it tried: the credential guard
then records a refusal before any mutation instead of the command failing blind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.model import Backend, RoutedAnswer
from anvil_ctl.engine.world import World

if TYPE_CHECKING:
    from anvil_ctl.commands.context import Context


class UnresolvedCredentialsRouter:
    """Stands in for the router when its tokens could not be resolved; every call refuses."""

    def __init__(self, error: CredentialError) -> None:
        self.error = error

    def _refuse(self) -> Any:
        raise AuthRejected(f"router credentials unavailable: {self.error}", **self.error.data)

    def probe_credentials(self) -> None:
        self._refuse()

    def backends(self, tier: str) -> list[Backend]:
        return list(self._refuse())

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        self._refuse()

    def deregister(self, tier: str, url: str) -> None:
        self._refuse()

    def drain(self, tier: str) -> None:
        self._refuse()

    def readmit(
        self, tier: str, url: str, aliases: tuple[str, ...], expected_model: str, deadline_s: float
    ) -> None:
        self._refuse()

    def routed_chat(self, alias: str) -> RoutedAnswer:
        return RoutedAnswer(self._refuse(), None)

    def ready(self) -> bool:
        return bool(self._refuse())

    def view(self, tier: str) -> dict[str, Any]:
        return {"tier": tier, "error": "credentials unavailable"}


def make_router(ctx: Context) -> Any:
    from anvil_ctl.adapters.credentials import resolve_credentials

    rc = ctx.config.router
    if rc.kind == "none":
        return None
    try:
        creds = resolve_credentials(rc, ctx.env, need_admin=rc.kind == "smg")
    except CredentialError as exc:
        return UnresolvedCredentialsRouter(exc)
    if rc.kind == "smg":
        from anvil_ctl.adapters.smg import SmgRouter

        return SmgRouter(rc.url, creds, admin_url=rc.admin_url)
    from anvil_ctl.adapters.haproxy import HaproxyRouter
    from anvil_ctl.core.errors import ConfigError

    if rc.runtime_socket is None:
        raise ConfigError(f"{ctx.settings.config}: router.runtime_socket: required for haproxy")
    tiers = {s.router_tier: s.aliases for s in ctx.config.slots.values()}
    return HaproxyRouter(rc.url, rc.runtime_socket, creds, tiers)


def real_world(ctx: Context) -> World:
    from anvil_ctl.adapters.docker_runtime import DockerRuntime
    from anvil_ctl.adapters.engine_http import HttpEngineProbe
    from anvil_ctl.adapters.shm import ShmScanner

    gpu_mode = "simulated" if ctx.settings.gpu == "simulated" else "nvidia"
    runtime = DockerRuntime(base_url=ctx.settings.docker_host, gpu_mode=gpu_mode)
    gpus: Any
    if ctx.settings.gpu == "simulated":
        from anvil_ctl.testing.gpu import SimulatedGpuProbe

        gpus = SimulatedGpuProbe(ctx.config.gpu_roles, runtime)
    else:
        from anvil_ctl.adapters.nvml import NvmlProbe

        gpus = NvmlProbe()
    world = World(
        settings=ctx.settings,
        config=ctx.config,
        store=ctx.store,
        runtime=runtime,
        engine=HttpEngineProbe(),
        router=make_router(ctx),
        gpus=gpus,
        shm=ShmScanner(),
    )
    if ctx.config.gpu_roles:
        from anvil_ctl.gpu.release import vram_release_step

        world.extras["vram_release"] = vram_release_step(
            gpus,
            world.clock,
            {r: g.uuid for r, g in ctx.config.gpu_roles.items()},
            reserve_mib={r: ctx.config.reserve_for(r) for r in ctx.config.gpu_roles},
            deadline_s=ctx.config.policy.vram_release_deadline_s,
        )
    return world
