"""The fake host's world: one JSON file guarded by an flock, and its failure knobs.

Several processes (a transaction SIGKILLed mid-step and the `recover` that follows
it) see the same host. `hang` makes one operation block after its side effect
until the knob is cleared; `fail` makes one raise StepFailed (a number of times).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anvil_ctl.core.errors import StepFailed

EMPTY: dict[str, Any] = {
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
    def edit(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            data = self._load()
            yield data
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def _load(self) -> dict[str, Any]:
        if self.path.exists():
            loaded: dict[str, Any] = json.loads(self.path.read_text())
            return loaded
        fresh: dict[str, Any] = json.loads(json.dumps(EMPTY))
        return fresh

    def read(self) -> dict[str, Any]:
        with self.edit() as data:
            copy: dict[str, Any] = json.loads(json.dumps(data))
            return copy

    def add_image(self, ref: str) -> str:
        image_id = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        with self.edit() as w:
            w["images"][image_id] = {"id": image_id, "tags": [ref], "repo_digests": []}
        return image_id

    def add_gpu(self, uuid: str, total_mib: int, name: str = "Fake GPU") -> None:
        with self.edit() as w:
            w["gpus"].append({"uuid": uuid, "name": name, "total_mib": total_mib})

    def append_log(self, container_id: str, *lines: str, restarts: int = 0, oom_killed: bool = False) -> None:
        """What a fake container printed, and what its runtime reports of restarts and OOM."""
        with self.edit() as w:
            c = w["containers"][container_id]
            c.setdefault("log", []).extend(lines)
            c["restart_count"] = c.get("restart_count", 0) + restarts
            c["oom_killed"] = c.get("oom_killed", False) or oom_killed

    def set_hang(self, op: str | None) -> None:
        with self.edit() as w:
            w["hang"] = op

    def set_fail(self, op: str, message: str | None, *, times: int | None = None) -> None:
        """Make `op` fail with `message` (None: stop failing); `times` limits how often."""
        with self.edit() as w:
            w.setdefault("fail_times", {}).pop(op, None)
            if message is None:
                w["fail"].pop(op, None)
            else:
                w["fail"][op] = message
                if times is not None:
                    w["fail_times"][op] = times


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
