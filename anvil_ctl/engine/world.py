"""The World: the ports, config and store one command works with, built by `anvil_ctl.bootstrap`.

Every field is a typed port or value; optional capabilities are optional fields
(a host without a router has `router=None`), never a string-keyed bag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from anvil_ctl.config import HostConfig, Settings
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import (
    ContainerInfo,
    ContainerLog,
    ContainerSpec,
    ImageInfo,
    ResidueFile,
    ResidueRemoval,
    VramNeed,
)
from anvil_ctl.core.ports import (
    Clock,
    ContainerRuntime,
    EngineProbe,
    GpuProbe,
    ModelCache,
    Progress,
    Router,
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
    engine: EngineProbe
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
        for part in (self.runtime, self.router, self.engine, self.gpus, self.acceptance):
            close = getattr(part, "close", None)
            if callable(close):
                close()


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


class _OneLook:
    """A ContainerRuntime that inspects each container, image and label query once (see
    `one_reading`); any change made through it forgets what it saw."""

    def __init__(self, runtime: ContainerRuntime) -> None:
        self.runtime = runtime
        self._seen: dict[tuple[str, str], object] = {}

    def _once(self, key: tuple[str, str], look: Callable[[], object]) -> object:
        if key not in self._seen:
            self._seen[key] = look()  # an error (NotFound) is raised each time, never kept
        return self._seen[key]

    def inspect(self, container_id: str) -> ContainerInfo:
        got = self._once(("inspect", container_id), lambda: self.runtime.inspect(container_id))
        assert isinstance(got, ContainerInfo)
        return got

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        key = ("list", repr(sorted((labels or {}).items())))
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
        self._seen.clear()
        return self.runtime.create(spec)

    def start(self, container_id: str) -> None:
        self._seen.clear()
        self.runtime.start(container_id)

    def stop(self, container_id: str, timeout_s: float) -> None:
        self._seen.clear()
        self.runtime.stop(container_id, timeout_s)

    def remove(self, container_id: str) -> None:
        self._seen.clear()
        self.runtime.remove(container_id)


@contextmanager
def one_reading(world: object) -> Iterator[None]:
    """A stretch in which the host is only observed: /dev/shm's residue is scanned once, and
    each container, image and container query is inspected once.

    For the checks before a transaction's first mutation and its before snapshot, and for
    recheck's assertions and snapshot: each asked for the residue, and each scan walks
    every process's maps and descriptors (tens of ms on a busy host), with nothing of ours
    changing it in between. The guards and the snapshot also ask Docker about the same few
    containers again and again (40-54 requests before a load's first step, each inspected
    container's fingerprint computed anew); they now see one reading of each, as the residue.
    Any other world (a plan under test) is left as it is.
    """
    if not isinstance(world, World):
        yield
        return
    shm, runtime = world.shm, world.runtime
    if shm is not None:
        world.shm = _OneScan(shm)
    world.runtime = _OneLook(runtime)
    try:
        yield
    finally:
        world.shm, world.runtime = shm, runtime
