"""The composition root: the only module that chooses implementations, built lazily from Settings.

Real adapters, or the fakes of `anvil_ctl.testing` (`ANVIL_BACKEND=fake`, `ANVIL_GPU=simulated`).
A router whose credentials cannot be resolved is wired as one that refuses every call, so the
credential guard records a refusal before any mutation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NoReturn

from anvil_ctl.config.host import HostConfig, load_host_config
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.errors import AuthRejected, ConfigError, CredentialError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import VramNeed
from anvil_ctl.core.ports import (
    ContainerRuntime,
    GpuProbe,
    Owner,
    Progress,
    Router,
    SharedMemory,
    SilentProgress,
)

if TYPE_CHECKING:
    from anvil_ctl.acceptance_worker import RealAcceptance
    from anvil_ctl.adapters.credentials import RouterCredentials
    from anvil_ctl.engine.runner import Faults
    from anvil_ctl.engine.world import RouteSample, World
    from anvil_ctl.persistence.db import Engine
    from anvil_ctl.persistence.store import Store
    from anvil_ctl.qualify.slosample import Sample


@dataclass
class App:
    """The composition root of one command: settings, environment, and (lazily) the rest."""

    settings: Settings
    env: dict[str, str]
    origins: dict[str, str] = field(default_factory=dict)
    """Where each path setting came from (`config.setting_origins`); empty for library callers."""
    progress: Progress = field(default_factory=SilentProgress)
    """Where transactions report their steps and waits: the CLI's renderer, or nothing."""
    keep_connection: bool = False
    """Keep one SQLite connection for the App's life, closed by `close` (the CLI)."""

    @cached_property
    def database(self) -> Engine:
        """The state database, which must exist: reading never creates a database or directory."""
        from anvil_ctl.persistence.db import make_engine

        return make_engine(self.settings.db_url, keep_connection=self.keep_connection)

    def create_database(self) -> Engine:
        """The state database for `init`, created when missing (with the default state directory)."""
        from anvil_ctl.persistence.db import make_engine

        if self.settings.state_db is None:
            try:
                self.settings.state_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"state directory {self.settings.state_dir} cannot be created: {exc.strerror}",
                    field="state_dir",
                ) from None
        engine = make_engine(self.settings.db_url, create=True, keep_connection=self.keep_connection)
        self.__dict__["database"] = engine
        return engine

    @cached_property
    def store(self) -> Store:
        """The state database's Store, attached to this host (refused when another machine holds the name)."""
        from anvil_ctl.persistence.head import head_path_for
        from anvil_ctl.persistence.hosts import attach
        from anvil_ctl.persistence.migrate import check_revision
        from anvil_ctl.persistence.store import Store

        check_revision(self.database)
        store = Store(self.database, head_path=head_path_for(self.settings.db_url, self.settings.state_dir))
        attach(store, self.host_name, machine_id=self.machine_id, boot_id=self.owner.boot_id)
        return store

    @cached_property
    def host_name(self) -> str:
        """The host config's host name, else the machine's; a host config is needed only if it exists."""
        import socket

        from anvil_ctl.config.host import machine_host_name

        if self.settings.config.exists() and self.config.host:
            return self.config.host
        return machine_host_name(socket.gethostname())

    @cached_property
    def machine_id(self) -> str:
        """This machine's identity (`machine_id_file`, /etc/machine-id by default)."""
        path = self.settings.machine_id_file
        try:
            value = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"machine id file {path}: cannot be read ({exc}); set ANVIL_MACHINE_ID_FILE",
                field="machine_id_file",
            ) from None
        if not value or len(value) > 64 or not value.isalnum():
            raise ConfigError(
                f"machine id file {path}: expected up to 64 letters and digits (a machine id)",
                field="machine_id_file",
            )
        return value

    @cached_property
    def config(self) -> HostConfig:
        path = self.settings.config
        origin = self.origins.get("config", "")
        if origin.startswith("default") and not path.exists():
            raise ConfigError(
                f"{path}: host config not found ({origin}); pass --config FILE or set ANVIL_CONFIG",
                file=str(path),
            )
        return load_host_config(path)

    def optional_config(self) -> HostConfig | None:
        """The host config, or None where none was named and the default file does not exist."""
        if self.origins.get("config", "").startswith("default") and not self.settings.config.exists():
            return None
        return self.config

    @cached_property
    def owner(self) -> Owner:
        from anvil_ctl.engine.owner import current_owner

        # Lock rows and transactions name the host by its fleet name, so that a second host
        # on one machine (tests) or a renamed machine keeps its records apart.
        me = current_owner()
        return Owner(pid=me.pid, hostname=self.host_name, boot_id=me.boot_id)

    def world(self) -> World:
        """The one World of this command (built on first use)."""
        cached: World | None = self.__dict__.get("_world")
        if cached is None:
            cached = _fake_world(self) if self.settings.backend == "fake" else _real_world(self)
            self.__dict__["_world"] = cached
        return cached

    def gpu_probe(self) -> GpuProbe:
        """The GPU probe the settings choose, without a world: NVML needs no host config."""
        if self.settings.backend == "fake":
            from anvil_ctl.testing.runtime import FakeGpus
            from anvil_ctl.testing.world import FakeWorld

            return FakeGpus(FakeWorld(self.settings.fake_world_path))
        if self.settings.gpu == "simulated":
            from anvil_ctl.adapters.simulated_gpu import SimulatedGpuProbe

            return SimulatedGpuProbe(self.config.gpu_roles, _docker(self))
        from anvil_ctl.adapters.nvml import NvmlProbe

        return NvmlProbe()

    def warm_acceptance(self) -> None:
        """Fork the real client's worker now (before `world()` and the host lock, so the child
        holds neither), so `openai` imports on another core meanwhile."""
        if self.settings.backend != "fake" and self.real_acceptance is not None:
            self.real_acceptance.warm()

    @cached_property
    def real_acceptance(self) -> RealAcceptance | None:
        """The real-client acceptance through the router; None without its credentials (then
        the router refuses every call)."""
        creds = _credentials(self, need_admin=self.config.router.kind == "smg")
        if creds is None or isinstance(creds, CredentialError):
            return None
        from anvil_ctl.acceptance_worker import RealAcceptance

        return RealAcceptance(self.config.router.url, creds.client)

    @cached_property
    def faults(self) -> Faults:
        """Fault injection, when the settings ask for it (tests and `make chaos` only)."""
        from anvil_ctl.engine.runner import Faults

        s = self.settings
        return Faults(crash_at=s.crash_at, pause_at=s.pause_at, pause_file=s.pause_file)

    def close(self) -> None:
        """Close the adapters' connections (Docker, router HTTP clients) and the database's."""
        world: World | None = self.__dict__.pop("_world", None)
        if world is not None:
            world.close()
        acceptance: RealAcceptance | None = self.__dict__.pop("real_acceptance", None)
        if acceptance is not None:  # warmed, and no world was built to close it (a refusal, bad input)
            acceptance.close()
        database: Engine | None = self.__dict__.get("database")
        if database is not None:
            database.dispose()


def _finish(app: App, world: World) -> World:
    """What both backends share: progress, the model cache and the VRAM-release gate (its
    module loaded on first use: most commands never wait for VRAM)."""
    world.progress = app.progress
    policy = app.config.policy
    if app.config.model_cache_dir is not None:
        from anvil_ctl.adapters.hfcache import HfCache

        world.model_cache = HfCache(app.config.model_cache_dir)
    if world.gpus is not None and app.config.gpu_roles:

        def gate(need: VramNeed) -> JSONObject:
            from anvil_ctl.engine.gpu_ownership import vram_release_gate

            poll_s = min(1.0, policy.health_poll_s)
            return vram_release_gate(world, deadline_s=policy.vram_release_deadline_s, poll_s=poll_s)(need)

        world.vram_release = gate
    return world


def _fake_world(app: App) -> World:
    from anvil_ctl.engine.world import World
    from anvil_ctl.testing.router import FakeRouter, fake_acceptance, fake_route_sample
    from anvil_ctl.testing.runtime import FakeGpus, FakeRuntime, FakeServerProbe, FakeSharedMemory
    from anvil_ctl.testing.world import FakeWorld

    fw = FakeWorld(app.settings.fake_world_path)
    router = FakeRouter(fw) if app.config.router.kind != "none" else None
    world = World(
        settings=app.settings,
        config=app.config,
        store=app.store,
        runtime=FakeRuntime(fw),
        server=FakeServerProbe(fw),
        router=router,
        gpus=FakeGpus(fw),
        shm=FakeSharedMemory(fw),
        acceptance=fake_acceptance(router) if router is not None else None,
        route_sample=fake_route_sample(router) if router is not None else None,
    )
    return _finish(app, world)


def _docker(app: App) -> ContainerRuntime:
    from anvil_ctl.adapters.docker_runtime import DockerRuntime

    simulated = app.settings.gpu == "simulated"
    return DockerRuntime(
        base_url=app.settings.docker_host, gpu_mode="simulated" if simulated else "auto", host=app.host_name
    )


def _real_world(app: App) -> World:
    from anvil_ctl.adapters.engine_http import HttpServerProbe
    from anvil_ctl.engine.world import World, current_runtime

    runtime = _docker(app)  # first: Docker out of reach is said before a host config's problem
    world = World(
        settings=app.settings,
        config=app.config,
        store=app.store,
        runtime=runtime,
        server=HttpServerProbe(),
        router=_router(app),
        acceptance=app.real_acceptance,  # None exactly where the router's credentials are
        route_sample=_route_sample(app),
    )
    # The scanner and the simulated GPUs list containers through the world's runtime of the moment.
    current = current_runtime(world)
    if app.settings.gpu == "simulated":
        from anvil_ctl.adapters.simulated_gpu import SimulatedGpuProbe

        world.gpus = SimulatedGpuProbe(app.config.gpu_roles, current)
    else:
        from anvil_ctl.adapters.nvml import NvmlProbe
        from anvil_ctl.adapters.shm import proc_cgroup_container

        world.gpus = NvmlProbe()
        # NVML reports engine worker PIDs; /proc tells which container each runs in.
        world.container_of_pid = proc_cgroup_container
    world.shm = _shm(app, current)
    return _finish(app, world)


def _shm(app: App, runtime: ContainerRuntime) -> SharedMemory:
    """The /dev/shm scanner: residue is only what managed containers held, or engines name so."""
    from anvil_ctl.adapters.shm import ShmScanner, managed_containers
    from anvil_ctl.persistence.shm_ledger import StoreShmLedger

    rc = app.config.residue
    return ShmScanner(
        rc.directory,
        include=rc.include,
        exclude=rc.exclude,
        managed=managed_containers(runtime),
        ledger=StoreShmLedger(app.store),
    )


def _router(app: App) -> Router | None:
    """The configured router, or one that refuses every call where its tokens cannot be resolved."""
    rc = app.config.router
    creds = _credentials(app, need_admin=rc.kind == "smg")
    if creds is None:
        return None
    if isinstance(creds, CredentialError):
        return UnresolvedCredentialsRouter(creds)
    if rc.kind == "smg":
        from anvil_ctl.adapters.smg import SmgRouter

        return SmgRouter(
            rc.url,
            creds,
            admin_url=rc.admin_url,
            metrics_url=rc.metrics_url,
            removal_hold_s=rc.removal_hold_s,
            removal_timeout_s=rc.drain_deadline_s,
        )
    from anvil_ctl.adapters.haproxy import HaproxyRouter

    if rc.runtime_socket is None:
        raise ConfigError(f"{app.settings.config}: router.runtime_socket: required for haproxy")
    tiers = {s.router_tier: s.aliases for s in app.config.slots.values()}
    return HaproxyRouter(rc.url, rc.runtime_socket, creds, tiers)


def _credentials(app: App, *, need_admin: bool) -> RouterCredentials | CredentialError | None:
    """The router's tokens through the credential chain, the reason they cannot be resolved,
    or None without a router."""
    from anvil_ctl.adapters.credentials import resolve_credentials

    if app.config.router.kind == "none":
        return None
    try:
        return resolve_credentials(app.config.router, app.env, need_admin=need_admin)
    except CredentialError as exc:
        return exc


def _route_sample(app: App) -> RouteSample | None:
    """A watch's active sample through the router with its client key (None without one)."""
    url, creds = app.config.router.url, _credentials(app, need_admin=False)
    if creds is None or isinstance(creds, CredentialError):
        return None

    def take(alias: str, requests: int, max_tokens: int, functional: int | None) -> Sample:
        from anvil_ctl.qualify.slosample import open_client, sample

        with open_client(url, creds.client.reveal()) as client:
            return sample(
                client,
                alias,
                requests=requests,
                max_tokens=max_tokens,
                clock=time.time(),
                functional=functional,
            )

    return take


class UnresolvedCredentialsRouter:
    """Stands in for a router whose tokens could not be resolved: every port call refuses, naming why."""

    def __init__(self, error: CredentialError) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Callable[..., NoReturn]:
        if name not in _ROUTER_CALLS:
            raise AttributeError(name)  # not the port's: `close` and the rest are absent

        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise AuthRejected(f"router credentials unavailable: {self.error}", **self.error.data)

        return refuse

    def view(self, tier: str) -> JSONObject:
        return {"tier": tier, "error": "credentials unavailable"}


_ROUTER_CALLS = frozenset(n for n in vars(Router) if not n.startswith("_"))
