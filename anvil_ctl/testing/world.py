"""The fake host's world: one JSON file (`WorldDoc`) guarded by an flock, shared by processes.

Failure knobs of the document: `hang` blocks one operation after its side effect until cleared;
`fail` makes one raise StepFailed (`fail_times` times, else until cleared).
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NotRequired, TypedDict

from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.model import ContainerStatus


class ContainerDoc(TypedDict):
    """A fake container: what the runtime reports, and what its engine serves while running."""

    id: str
    name: str
    image_id: str
    image_ref: str
    status: ContainerStatus
    labels: dict[str, str]
    fingerprint: str
    gpu_uuids: list[str]
    served_model: str
    max_model_len: int
    healthy: bool
    vram_mib: int
    binding: str
    no_health_route: NotRequired[bool]
    """llama.cpp's way: no health route (404)."""
    echo_model: NotRequired[bool]
    """llama.cpp's way: a routed answer carries the request's model (the alias)."""
    log: NotRequired[list[str]]
    log_at: NotRequired[list[float]]
    """The Unix time each `log` line was appended (`ContainerRuntime.logs(since=...)`)."""
    in_flight: NotRequired[int]
    """Requests the engine is answering; each look at the count sees one fewer (they end
    while a drain waits) unless `in_flight_stuck`."""
    in_flight_stuck: NotRequired[bool]


class ImageDoc(TypedDict):
    id: str
    tags: list[str]
    repo_digests: list[str]


class TierDoc(TypedDict):
    """A router tier: its one backend URL (None: none), client aliases, maint/drain/ready."""

    url: str | None
    aliases: list[str]
    state: str


class ReadmitDoc(TypedDict):
    tier: str
    url: str
    hold: bool


class RouterDoc(TypedDict):
    tiers: dict[str, TierDoc]
    admin_token_ok: bool
    ready: bool
    readmits: NotRequired[list[ReadmitDoc]]


class GpuDoc(TypedDict):
    uuid: str
    name: str
    total_mib: int


class ResidueDoc(TypedDict):
    """A file in the fake shared memory (see `FakeSharedMemory`)."""

    path: str
    size: int
    pids: NotRequired[list[int]]
    ours: NotRequired[bool]


class WorldDoc(TypedDict):
    containers: dict[str, ContainerDoc]
    images: dict[str, ImageDoc]
    router: RouterDoc
    gpus: list[GpuDoc]
    residue: list[ResidueDoc]
    hang: str | None
    fail: dict[str, str]
    fail_times: dict[str, int]
    counter: int
    route_sample_ttft_s: NotRequired[float]
    """The first-token time the fake route sample reports (a slow serve under watch)."""


EMPTY: WorldDoc = {
    "containers": {},
    "images": {},
    "router": {"tiers": {}, "admin_token_ok": True, "ready": True},
    "gpus": [],
    "residue": [],
    "hang": None,
    "fail": {},
    "fail_times": {},
    "counter": 0,
}


class FakeWorld:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lk:
            fcntl.flock(lk, how)
            yield

    @contextmanager
    def edit(self) -> Iterator[WorldDoc]:
        with self._locked(fcntl.LOCK_EX):
            data = self._load()
            yield data
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def _load(self) -> WorldDoc:
        loaded: WorldDoc = json.loads(self.path.read_text() if self.path.exists() else json.dumps(EMPTY))
        return loaded

    def read(self) -> WorldDoc:
        """A copy of the world, read under a shared lock (a read rewrites nothing)."""
        with self._locked(fcntl.LOCK_SH):
            return self._load()


def maybe_hang_or_fail(world: FakeWorld, op: str) -> None:
    with world.edit() as data:
        message = data["fail"].get(op)
        left = data.get("fail_times", {}).get(op)
        if message is not None and left is not None:
            if left <= 1:
                data["fail"].pop(op)
                data["fail_times"].pop(op)
            else:
                data["fail_times"][op] = left - 1
    if message is not None:
        raise StepFailed(f"fake {op} failed: {message}")
    while world.read().get("hang") == op:
        time.sleep(0.05)
