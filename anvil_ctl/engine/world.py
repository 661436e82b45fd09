"""The World: the ports, config and store one command works with, built by `anvil_ctl.bootstrap`.
Optional capabilities are optional fields (no router: `router=None`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from anvil_ctl.config.host import HostConfig
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import (
    LABEL_MANAGED,
    ContainerInfo,
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
    from anvil_ctl.qualify.slosample import Sample


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

RouteSample = Callable[[str, int, int, int | None], "Sample"]
"""Streamed chats through the router: (alias, requests, max_tokens, functional check or None)
-> one sample (`qualify.slosample`)."""

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
    route_sample: RouteSample | None = None
    """None where no client can reach the router: a watched promote is then refused."""
    vram_release: VramRelease | None = None
    """None where no GPU probe or no GPU role is configured."""
    container_of_pid: ContainerOfPid | None = None
    """Real GPUs only: NVML's PIDs are engine workers, children of the container's init."""
    hold_readmissions: bool = False
    """Every readmission holds as if a removal were pending: set by `recover`, since a dead
    process may have sent removals no adapter of this one saw."""
    progress: Progress = field(default_factory=SilentProgress)
    """Where steps report their waits (the CLI's renderer; silent by default)."""
    wait_limit_s: float | None = None
    """`--timeout`: no forward wait (health, VRAM release, drain, readmission) lasts longer."""
    kept_reading: tuple[dict[str, object], dict[str, object]] | None = None
    """What a stretch opened with `keep` saw, for the next one opened with `resume` (`one_reading`)."""
    undoing: bool = False
    """Set while compensating: undos keep the configured deadlines rather than leave a slot dark."""

    def wait(self, what: str, configured_s: float) -> float:
        """The configured deadline, capped by `--timeout` on the forward path; reported as a wait."""
        limit = None if self.undoing else self.wait_limit_s
        deadline_s = configured_s if limit is None else min(configured_s, limit)
        self.progress.waiting(what, deadline_s)
        return deadline_s

    def close(self) -> None:
        """Close the adapters' connections (Docker, router HTTP clients)."""
        for part in (self.runtime, self.router, self.server, self.gpus, self.acceptance):
            close = getattr(part, "close", None)
            if callable(close):
                close()


class _CurrentRuntime:
    def __init__(self, world: World) -> None:
        self.world = world

    def __getattr__(self, name: str) -> object:
        return getattr(self.world.runtime, name)


def current_runtime(world: World) -> ContainerRuntime:
    """The world's container runtime as it is at each call (inside `one_reading`, the stretch's),
    for the adapters built beside the world that list its managed containers."""
    return cast(ContainerRuntime, _CurrentRuntime(world))


class _Reading:
    """A port inside a stretch (`one_reading`): each of its `reads` is asked once per arguments,
    each of its `changes` forgets what the stretch saw; anything else is asked every time."""

    def __init__(
        self, port: object, seen: dict[str, object], reads: frozenset[str], changes: frozenset[str]
    ) -> None:
        self.port, self.seen, self.reads, self.changes = port, seen, reads, changes

    def ask(self, name: str, *args: object, **kw: object) -> object:
        key = repr((id(self.port), name, args, sorted(kw.items())))
        if key not in self.seen:
            self.seen[key] = getattr(self.port, name)(*args, **kw)
        got = self.seen[key]
        # Callers own what they are given (a snapshot keeps the router's view, a list is extended).
        return copy.deepcopy(got) if isinstance(got, dict) else list(got) if isinstance(got, list) else got

    def __getattr__(self, name: str) -> object:
        found = getattr(self.port, name)
        if name in self.reads:
            return lambda *args, **kw: self.ask(name, *args, **kw)
        if name in self.changes:

            def change(*args: object, **kw: object) -> object:
                self.seen.clear()  # a started container serves (and holds VRAM), a route moved
                return found(*args, **kw)

            return change
        return found


class _Runtime(_Reading):
    """The container runtime in a stretch: one listing of the managed containers answers every
    narrower query of them, and serves as each listed container's inspect."""

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = dict(labels or {})
        if wanted.get(LABEL_MANAGED) == "true" and len(wanted) > 1:
            managed = self.list(labels={LABEL_MANAGED: "true"})
            return [c for c in managed if all(c.labels.get(k) == v for k, v in wanted.items())]
        fresh = repr((id(self.port), "list", (), sorted({"labels": labels}.items()))) not in self.seen
        got = self.ask("list", labels=labels)
        assert isinstance(got, list)
        if fresh:
            for info in got:
                self.seen.setdefault(repr((id(self.port), "inspect", (info.id,), [])), info)
        return got


_STRETCH: dict[str, tuple[type[_Reading], frozenset[str], frozenset[str]]] = {
    "runtime": (
        _Runtime,
        frozenset({"inspect", "list", "image"}),
        frozenset({"create", "start", "stop", "remove"}),
    ),
    "server": (_Reading, frozenset({"health", "models", "listening"}), frozenset()),
    "router": (
        _Reading,
        frozenset({"backends", "view", "ready", "routed_chat", "check_route"}),
        frozenset({"register", "deregister", "drain", "readmit"}),
    ),
    "gpus": (_Reading, frozenset({"gpus"}), frozenset()),
}
"""Per port of the world read once in a stretch: how it is read, what it reads, what changes."""


@contextmanager
def one_reading(world: object, *, keep: bool = False, resume: bool = False) -> Iterator[None]:
    """A stretch in which the host is only observed: each question to a port is asked once; a
    change made through it forgets every reading, and nothing may poll inside one. A stretch
    inside a stretch is the outer one. `keep`: what it saw stays on the world; `resume`: it
    starts from that, which only a stretch following with nothing acted between may do."""
    if not isinstance(world, World) or isinstance(world.runtime, _Reading):
        yield  # not a World, or already inside a stretch: its one reading goes on
        return
    kept, world.kept_reading = world.kept_reading, None
    seen, shm_seen = kept if (resume and kept) else ({}, {})
    ports = {name: getattr(world, name) for name in ("shm", *_STRETCH)}
    for name, (reading, reads, changes) in _STRETCH.items():
        if ports[name] is not None:
            setattr(world, name, reading(ports[name], seen, reads, changes))
    if world.shm is not None:  # scanned once; a removal scans again (a stretch of its own)
        world.shm = cast(
            SharedMemory, _Reading(world.shm, shm_seen, frozenset({"residue"}), frozenset({"remove_unheld"}))
        )
    try:
        yield
        if keep:
            world.kept_reading = (seen, shm_seen)
    finally:
        for name, port in ports.items():
            setattr(world, name, port)
