"""Real adapters for the World: Docker, the configured router, NVML or simulated GPUs.

A router whose credentials cannot be resolved is still wired, as a router that
refuses every call naming the credential sources it tried: the credential guard
then records a refusal before any mutation instead of the command failing blind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.model import Backend, RoutedAnswer
from anvil_ctl.engine import gpu_hooks
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


def make_router(ctx: Context) -> tuple[Any, dict[str, Any]]:
    """The configured router and the extras that need its credentials (real-client acceptance)."""
    from anvil_ctl.adapters.credentials import resolve_credentials

    rc = ctx.config.router
    if rc.kind == "none":
        return None, {}
    try:
        creds = resolve_credentials(rc, ctx.env, need_admin=rc.kind == "smg")
    except CredentialError as exc:
        return UnresolvedCredentialsRouter(exc), {}

    def acceptance(alias: str, model: str) -> Any:
        from anvil_ctl.acceptance import run_acceptance

        return run_acceptance(rc.url, alias, model, creds.client)

    extras: dict[str, Any] = {"acceptance": acceptance, "client_token": creds.client}
    if rc.kind == "smg":
        from anvil_ctl.adapters.smg import SmgRouter

        return SmgRouter(rc.url, creds, admin_url=rc.admin_url), extras
    from anvil_ctl.adapters.haproxy import HaproxyRouter
    from anvil_ctl.core.errors import ConfigError

    if rc.runtime_socket is None:
        raise ConfigError(f"{ctx.settings.config}: router.runtime_socket: required for haproxy")
    tiers = {s.router_tier: s.aliases for s in ctx.config.slots.values()}
    return HaproxyRouter(rc.url, rc.runtime_socket, creds, tiers), extras


def real_world(ctx: Context) -> World:
    from anvil_ctl.adapters.docker_runtime import DockerRuntime
    from anvil_ctl.adapters.engine_http import HttpEngineProbe
    from anvil_ctl.adapters.shm import ShmScanner

    gpu_mode: Literal["nvidia", "simulated"] = "simulated" if ctx.settings.gpu == "simulated" else "nvidia"
    runtime = DockerRuntime(base_url=ctx.settings.docker_host, gpu_mode=gpu_mode)
    gpus: Any
    if ctx.settings.gpu == "simulated":
        from anvil_ctl.testing.gpu import SimulatedGpuProbe

        gpus = SimulatedGpuProbe(ctx.config.gpu_roles, runtime)
    else:
        from anvil_ctl.adapters.nvml import NvmlProbe

        gpus = NvmlProbe()
    router, router_extras = make_router(ctx)
    world = World(
        settings=ctx.settings,
        config=ctx.config,
        store=ctx.store,
        runtime=runtime,
        engine=HttpEngineProbe(),
        router=router,
        gpus=gpus,
        shm=ShmScanner(),
    )
    world.extras.update(router_extras)
    if ctx.config.model_cache_dir is not None:
        from anvil_ctl.adapters.hfcache import HfCache

        world.model_cache = HfCache(ctx.config.model_cache_dir)
    # NVML reports engine worker PIDs; /proc tells which container each runs in.
    by_cgroup = gpu_hooks.proc_cgroup_container if ctx.settings.gpu != "simulated" else None
    return gpu_hooks.install(world, container_of_pid=by_cgroup)
