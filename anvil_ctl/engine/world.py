"""The World: the ports, config and store one command works with, built by `anvil_ctl.bootstrap`.

Every field is a typed port or value; optional capabilities are optional fields
(a host without a router has `router=None`), never a string-keyed bag.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from anvil_ctl.config.host import HostConfig
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import (
    LABEL_MANAGED,
    Backend,
    ContainerInfo,
    ContainerLog,
    ContainerSpec,
    GpuReading,
    ImageInfo,
    ModelCard,
    PromptAnswer,
    ResidueFile,
    ResidueRemoval,
    RouteCheck,
    RoutedAnswer,
    VramNeed,
)
from anvil_ctl.core.ports import (
    Clock,
    ContainerRuntime,
    GpuProbe,
    ModelCache,
    Progress,
    Router,
    ServerProbe,
    SharedMemory,
    SilentProgress,
)

if TYPE_CHECKING:
    from anvil_ctl.persistence.store import Store


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class AcceptanceReport(Protocol):
    @property
    def passed(self) -> bool: ...

    def failed_checks(self) -> list[str]: ...

    def as_dict(self) -> JSONObject: ...


Acceptance = Callable[[str, str], AcceptanceReport]
"""Real-client acceptance through the router: (alias, expected served model) -> report."""

VramRelease = Callable[[VramNeed], JSONObject]
"""The VRAM-release gate: wait until the need is free, return both readings (StepFailed at the deadline)."""

ContainerOfPid = Callable[[int], str | None]
"""Which container a host PID runs in (NVML reports engine worker PIDs), None if none."""


@dataclass
class World:
    settings: Settings
    config: HostConfig
    store: Store
    runtime: ContainerRuntime
    server: ServerProbe
    router: Router | None = None
    gpus: GpuProbe | None = None
    shm: SharedMemory | None = None
    model_cache: ModelCache | None = None
    clock: Clock = field(default_factory=SystemClock)
    acceptance: Acceptance | None = None
    """None where no real client can reach the router (the step then fails, never skips)."""
    vram_release: VramRelease | None = None
    """None where no GPU probe or no GPU role is configured."""
    container_of_pid: ContainerOfPid | None = None
    """Real GPUs only: NVML's PIDs are engine workers, children of the container's init."""
    hold_readmissions: bool = False
    """Every readmission holds as if a removal were pending (`Router.readmit(hold=True)`):
    `recover` sets it, because a process that died mid-drain may have sent removals that
    no adapter of this process saw."""
    progress: Progress = field(default_factory=SilentProgress)
    """Where steps report their waits (the CLI's renderer; silent by default)."""
    wait_limit_s: float | None = None
    """`--timeout`: no forward wait (health, VRAM release, drain, readmission) lasts longer."""
    undoing: bool = False
    """Set by the engine while it compensates: undos keep the configured deadlines, since
    giving up early on bringing a serve back would leave the slot dark."""

    def deadline(self, configured_s: float) -> float:
        """How long a wait may last: the configured deadline, capped by `--timeout` on the
        forward path."""
        if self.wait_limit_s is None or self.undoing:
            return configured_s
        return min(configured_s, self.wait_limit_s)

    def wait(self, what: str, configured_s: float) -> float:
        """Report a wait for `what` and return its deadline (`deadline`)."""
        deadline_s = self.deadline(configured_s)
        self.progress.waiting(what, deadline_s)
        return deadline_s

    def close(self) -> None:
        """Close the adapters' connections (Docker, router HTTP clients)."""
        for part in (self.runtime, self.router, self.server, self.gpus, self.acceptance):
            close = getattr(part, "close", None)
            if callable(close):
                close()


class WorldRuntime:
    """The world's container runtime as it is at each call: inside `one_reading` the stretch's
    one look. For the adapters built beside the world that list its managed containers (the
    /dev/shm scanner, the simulated GPUs): in a stretch their listing is the stretch's."""

    def __init__(self, world: World) -> None:
        self.world = world

    def inspect(self, container_id: str) -> ContainerInfo:
        return self.world.runtime.inspect(container_id)

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        return self.world.runtime.list(labels=labels)

    def image(self, ref: str) -> ImageInfo:
        return self.world.runtime.image(ref)

    def logs(self, container_id: str, *, max_lines: int, max_bytes: int) -> ContainerLog:
        return self.world.runtime.logs(container_id, max_lines=max_lines, max_bytes=max_bytes)

    def create(self, spec: ContainerSpec) -> str:
        return self.world.runtime.create(spec)

    def start(self, container_id: str) -> None:
        self.world.runtime.start(container_id)

    def stop(self, container_id: str, timeout_s: float) -> None:
        self.world.runtime.stop(container_id, timeout_s)

    def remove(self, container_id: str) -> None:
        self.world.runtime.remove(container_id)


class _OneScan:
    """A SharedMemory whose residue is scanned once (see `one_reading`)."""

    def __init__(self, shm: SharedMemory) -> None:
        self.shm = shm
        self._residue: list[ResidueFile] | None = None

    def residue(self) -> list[ResidueFile]:
        if self._residue is None:
            self._residue = self.shm.residue()
        return list(self._residue)

    def remove_unheld(self) -> ResidueRemoval:
        self._residue = None  # a removal changes what is there: the next reading scans again
        return self.shm.remove_unheld()


class _Once:
    """One kind of reading in a stretch (see `one_reading`): each question is answered once,
    until a change through any reading of the stretch forgets them all; an error (NotFound,
    an unreachable endpoint) is raised each time, never kept."""

    def __init__(self, stretch: list[_Once]) -> None:
        self._seen: dict[tuple[object, ...], object] = {}
        self._stretch = stretch
        stretch.append(self)

    def _once(self, key: tuple[object, ...], look: Callable[[], object]) -> object:
        if key not in self._seen:
            self._seen[key] = look()
        return self._seen[key]

    def forget(self) -> None:
        """Something changed: a started container serves (and holds GPU memory), a route moved."""
        for reading in self._stretch:
            reading._seen.clear()


class _OneLook(_Once):
    """A ContainerRuntime that inspects each container, image and label query once (see
    `one_reading`); any change made through it forgets what the stretch saw."""

    def __init__(self, runtime: ContainerRuntime, stretch: list[_Once]) -> None:
        super().__init__(stretch)
        self.runtime = runtime

    def inspect(self, container_id: str) -> ContainerInfo:
        got = self._once(("inspect", container_id), lambda: self.runtime.inspect(container_id))
        assert isinstance(got, ContainerInfo)
        return got

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = dict(labels or {})
        if wanted.get(LABEL_MANAGED) == "true" and len(wanted) > 1:
            # One listing of the managed containers answers every narrower query of them (the
            # slot's, the candidates'): the runtime's label filter is this exact match.
            return [
                c
                for c in self.list(labels={LABEL_MANAGED: "true"})
                if all(c.labels.get(k) == v for k, v in wanted.items())
            ]
        key = ("list", repr(sorted(wanted.items())))
        fresh = key not in self._seen
        got = self._once(key, lambda: self.runtime.list(labels=labels))
        assert isinstance(got, list)
        if fresh:  # a listed container was inspected to be listed: that is its inspect
            for info in got:
                self._seen.setdefault(("inspect", info.id), info)
        return list(got)

    def image(self, ref: str) -> ImageInfo:
        got = self._once(("image", ref), lambda: self.runtime.image(ref))
        assert isinstance(got, ImageInfo)
        return got

    def logs(self, container_id: str, *, max_lines: int, max_bytes: int) -> ContainerLog:
        return self.runtime.logs(container_id, max_lines=max_lines, max_bytes=max_bytes)

    def create(self, spec: ContainerSpec) -> str:
        self.forget()
        return self.runtime.create(spec)

    def start(self, container_id: str) -> None:
        self.forget()
        self.runtime.start(container_id)

    def stop(self, container_id: str, timeout_s: float) -> None:
        self.forget()
        self.runtime.stop(container_id, timeout_s)

    def remove(self, container_id: str) -> None:
        self.forget()
        self.runtime.remove(container_id)


class _OneProbe(_Once):
    """A ServerProbe that asks each binding for its health, model list and listening once
    (see `one_reading`); the context-refusal probe is asked every time."""

    def __init__(self, server: ServerProbe, stretch: list[_Once]) -> None:
        super().__init__(stretch)
        self.server = server

    def health(self, base_url: str, path: str) -> bool:
        return bool(self._once(("health", base_url, path), lambda: self.server.health(base_url, path)))

    def models(self, base_url: str) -> list[ModelCard]:
        got = self._once(("models", base_url), lambda: self.server.models(base_url))
        assert isinstance(got, list)
        return list(got)

    def listening(self, base_url: str) -> bool:
        return bool(self._once(("listening", base_url), lambda: self.server.listening(base_url)))

    def probe_prompt(self, base_url: str, model: str, words: int) -> PromptAnswer:
        return self.server.probe_prompt(base_url, model, words)

    def running(self, base_url: str, metric: str) -> int | None:
        return self.server.running(base_url, metric)  # a count changes while a drain polls it


class _OneRoute(_Once):
    """A Router whose reads (backends, view, readiness, a routed chat by alias, a route check)
    are asked once (see `one_reading`); a change through it (register, deregister, drain,
    readmit) forgets what it saw. The credential probe is asked every time."""

    def __init__(self, router: Router, stretch: list[_Once]) -> None:
        super().__init__(stretch)
        self.router = router

    def probe_credentials(self) -> None:
        self.router.probe_credentials()

    def backends(self, tier: str) -> list[Backend]:
        got = self._once(("backends", tier), lambda: self.router.backends(tier))
        assert isinstance(got, list)
        return list(got)

    def view(self, tier: str) -> JSONObject:
        got = self._once(("view", tier), lambda: self.router.view(tier))
        assert isinstance(got, dict)
        return copy.deepcopy(got)  # it goes into snapshots, which own what they hold

    def ready(self) -> bool:
        return bool(self._once(("ready",), self.router.ready))

    def routed_chat(self, alias: str) -> RoutedAnswer:
        got = self._once(("chat", alias), lambda: self.router.routed_chat(alias))
        assert isinstance(got, RoutedAnswer)
        return got

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        got = self._once(
            ("route", tier, url, expected_model), lambda: self.router.check_route(tier, url, expected_model)
        )
        assert isinstance(got, RouteCheck)
        return got

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        self.forget()
        self.router.register(tier, url, aliases)

    def deregister(self, tier: str, url: str) -> None:
        self.forget()
        self.router.deregister(tier, url)

    def drain(self, tier: str) -> None:
        self.forget()
        self.router.drain(tier)

    def in_flight(self, tier: str, url: str) -> int | None:
        return self.router.in_flight(tier, url)  # a count changes while a drain polls it

    def readmit(
        self,
        tier: str,
        url: str,
        aliases: tuple[str, ...],
        expected_model: str,
        deadline_s: float,
        *,
        hold: bool = False,
    ) -> None:
        self.forget()
        self.router.readmit(tier, url, aliases, expected_model, deadline_s, hold=hold)


class _OneGpuReading(_Once):
    """A GpuProbe read once (see `one_reading`): the simulated probe lists the managed
    containers and asks each stub engine, NVML asks the driver."""

    def __init__(self, gpus: GpuProbe, stretch: list[_Once]) -> None:
        super().__init__(stretch)
        self.gpus_probe = gpus

    def gpus(self) -> list[GpuReading]:
        got = self._once(("gpus",), self.gpus_probe.gpus)
        assert isinstance(got, list)
        return list(got)

    def driver_version(self) -> str:
        return self.gpus_probe.driver_version()


@contextmanager
def one_reading(world: object) -> Iterator[None]:
    """A stretch in which the host is only observed: /dev/shm's residue is scanned once, and
    each container, image and container query, each binding's health and model list, each
    router reading (backends, view, readiness, a routed chat by alias, a route check) and the
    GPU readings are asked once.

    For the checks before a transaction's first mutation, its before snapshot and its
    availability check, for the goal check and after snapshot, and for recheck's assertions
    and snapshot: each asked for the residue, and each scan walks every process's maps and
    descriptors (tens of ms on a busy host), with nothing of ours changing it in between. The
    guards and the snapshot also asked Docker about the same few containers again and again
    (40-54 requests before a load's first step), the binding for its models five times, smg
    for its workers and readiness four, and made the same routed chat twice (BaseVerified's
    smoke, then the availability check); they now see one reading of each, as the residue.
    A change made through the stretch (a container started, a route re-applied) forgets every
    reading; nothing may wait for a change inside one (a poll would see its first answer
    forever). A stretch inside a stretch is the outer one. Any other world (a plan under
    test) is left as it is.
    """
    if not isinstance(world, World) or isinstance(world.runtime, _Once):
        yield  # not a World, or already inside a stretch: its one reading goes on
        return
    shm, runtime, server, router, gpus = world.shm, world.runtime, world.server, world.router, world.gpus
    stretch: list[_Once] = []
    if shm is not None:
        world.shm = _OneScan(shm)
    world.runtime = _OneLook(runtime, stretch)
    world.server = _OneProbe(server, stretch)
    world.router = _OneRoute(router, stretch) if router is not None else None
    world.gpus = _OneGpuReading(gpus, stretch) if gpus is not None else None
    try:
        yield
    finally:
        world.shm, world.runtime, world.server, world.router, world.gpus = shm, runtime, server, router, gpus
