"""File-backed fakes of the container runtime, engine, router and shared memory.

The world lives in one JSON file guarded by an flock, so that several processes
(a transaction SIGKILLed mid-step and the `recover` that follows it) see the same
host. `make demo` and the engine's unit tests run against it.

A fake container serves its `served_model` while running; `hang` makes one
operation block after its side effect until the knob is cleared, which lets a
test kill the process between a step's intent and its result.
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

from anvil_ctl.core.errors import AuthRejected, NotFound, StepFailed, TransientError
from anvil_ctl.core.model import (
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
    ShmMark,
    config_fingerprint,
)

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


def _maybe_hang_or_fail(world: FakeWorld, op: str) -> None:
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


class FakeRuntime:
    """ContainerRuntime over the fake world."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def _info(self, c: dict[str, Any]) -> ContainerInfo:
        return ContainerInfo(
            id=c["id"],
            name=c["name"],
            image_id=c["image_id"],
            image_ref=c["image_ref"],
            status=c["status"],
            labels=dict(c["labels"]),
            fingerprint=c["fingerprint"],
            gpu_uuids=tuple(c["gpu_uuids"]),
        )

    def inspect(self, container_id: str) -> ContainerInfo:
        c = self.world.read()["containers"].get(container_id)
        if c is None:
            raise NotFound(f"container {container_id} not found", container_id=container_id)
        return self._info(c)

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        out = []
        for c in self.world.read()["containers"].values():
            if all(c["labels"].get(k) == v for k, v in (labels or {}).items()):
                out.append(self._info(c))
        return out

    def image(self, ref: str) -> ImageInfo:
        for img in self.world.read()["images"].values():
            if ref == img["id"] or ref in img["tags"] or ref in img["repo_digests"]:
                return ImageInfo(img["id"], tuple(img["repo_digests"]), tuple(img["tags"]))
        raise NotFound(f"image {ref} not found", image=ref)

    def create(self, spec: ContainerSpec) -> str:
        image = self.image(spec.image)
        with self.world.edit() as w:
            w["counter"] += 1
            cid = hashlib.sha256(f"{spec.name}-{w['counter']}".encode()).hexdigest()
            env = dict(spec.env)
            w["containers"][cid] = {
                "id": cid,
                "name": spec.name,
                "image_id": image.id,
                "image_ref": spec.image,
                "status": "created",
                "labels": dict(spec.labels),
                "fingerprint": config_fingerprint(spec.fingerprint_fields()),
                "gpu_uuids": list(spec.gpu_uuids),
                "served_model": env.get("FAKE_SERVED_MODEL", ""),
                "max_model_len": int(env.get("FAKE_MAX_MODEL_LEN", "0") or 0),
                "healthy": env.get("FAKE_FAIL_HEALTH") != "1",
                "vram_mib": int(env.get("FAKE_VRAM_MIB", "0") or 0),
                "binding": env.get("FAKE_BINDING", ""),
                # llama.cpp's ways: no health route (404), answers echo the request's model
                "no_health_route": env.get("FAKE_NO_HEALTH_ROUTE") == "1",
                "echo_model": env.get("FAKE_ECHO_MODEL") == "1",
            }
        _maybe_hang_or_fail(self.world, "create")
        return cid

    def _set_status(self, container_id: str, status: str) -> None:
        with self.world.edit() as w:
            c = w["containers"].get(container_id)
            if c is None:
                raise NotFound(f"container {container_id} not found", container_id=container_id)
            c["status"] = status

    def start(self, container_id: str) -> None:
        self._set_status(container_id, "running")
        _maybe_hang_or_fail(self.world, "start")

    def stop(self, container_id: str, timeout_s: float) -> None:
        self._set_status(container_id, "exited")
        _maybe_hang_or_fail(self.world, "stop")

    def remove(self, container_id: str) -> None:
        with self.world.edit() as w:
            if w["containers"].pop(container_id, None) is None:
                raise NotFound(f"container {container_id} not found", container_id=container_id)

    def logs(self, container_id: str, *, max_lines: int, max_bytes: int) -> ContainerLog:
        """The container's `log` lines (see `FakeWorld.append_log`), restart count and OOM flag."""
        c = self.world.read()["containers"].get(container_id)
        if c is None:
            raise NotFound(f"container {container_id} not found", container_id=container_id)
        lines = c.get("log", [])[-(max_lines + 1) :]
        tail = "".join(line + "\n" for line in lines).encode()
        return ContainerLog.bounded(
            tail,
            max_lines=max_lines,
            max_bytes=max_bytes,
            restart_count=int(c.get("restart_count", 0)),
            oom_killed=bool(c.get("oom_killed", False)),
            status=c["status"],
        )


class FakeEngineProbe:
    """Answers for the running fake container whose binding matches the URL."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def _serving(self, base_url: str) -> dict[str, Any] | None:
        binding = base_url.removeprefix("http://").rstrip("/")
        for c in self.world.read()["containers"].values():
            if c["status"] == "running" and c["binding"] == binding:
                found: dict[str, Any] = c
                return found
        return None

    def listening(self, base_url: str) -> bool:
        return self._serving(base_url) is not None

    def health(self, base_url: str, path: str) -> bool:
        c = self._serving(base_url)
        return bool(c and c["healthy"] and not c.get("no_health_route"))

    def models(self, base_url: str) -> list[ModelCard]:
        c = self._serving(base_url)
        if c is None:
            return []
        return [ModelCard(c["served_model"], c["max_model_len"] or None)]

    def probe_prompt(self, base_url: str, model: str, words: int) -> PromptAnswer:
        """Refuses a prompt at or above the container's max_model_len the way llama.cpp does."""
        c = self._serving(base_url)
        if c is None:
            raise TransientError(f"{base_url}: connection refused")
        limit = c["max_model_len"]
        if limit and words >= limit:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{words} tokens ({words} in the messages, 1 in the completion)."
            )
            return PromptAnswer(400, json.dumps({"error": {"message": message}}))
        return PromptAnswer(200, json.dumps({"model": model}))


class FakeRouter:
    """A router whose tiers map to one backend URL each; routed answers come from FakeEngineProbe."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world
        self.engine = FakeEngineProbe(world)

    def probe_credentials(self) -> None:
        if not self.world.read()["router"]["admin_token_ok"]:
            raise AuthRejected("router answered 401 to the admin token from the fake credential source")

    def _tier(self, w: dict[str, Any], tier: str) -> dict[str, Any]:
        tiers: dict[str, dict[str, Any]] = w["router"]["tiers"]
        return tiers.setdefault(tier, {"url": None, "aliases": [], "state": "maint"})

    def backends(self, tier: str) -> list[Backend]:
        t = self.world.read()["router"]["tiers"].get(tier)
        if not t or not t["url"]:
            return []
        models = tuple(m.id for m in self.engine.models(t["url"]))
        healthy = self.engine.health(t["url"], "/health")
        return [Backend(t["url"], healthy, models, t["state"])]

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        with self.world.edit() as w:
            t = self._tier(w, tier)
            t.update(url=url, aliases=list(aliases), state="ready")

    def deregister(self, tier: str, url: str) -> None:
        with self.world.edit() as w:
            t = self._tier(w, tier)
            if t["url"] == url:
                t.update(url=None, state="maint")

    def drain(self, tier: str) -> None:
        with self.world.edit() as w:
            self._tier(w, tier)["state"] = "drain"

    def readmit(
        self, tier: str, url: str, aliases: tuple[str, ...], expected_model: str, deadline_s: float
    ) -> None:
        self.probe_credentials()
        _maybe_hang_or_fail(self.world, "readmit")
        self.register(tier, url, aliases)
        # The readmission's own check (part of readmitting, as smg's and HAProxy's are): a
        # test that replaces `routed_chat` to restart the router sees only later chats.
        answer = self._answer(aliases[0])
        if answer.model != expected_model:
            raise StepFailed(
                f"readmission of {tier}: routed answer from {answer.model!r}, expected {expected_model}"
            )

    def routed_chat(self, alias: str) -> RoutedAnswer:
        return self._answer(alias)

    def _answer(self, alias: str) -> RoutedAnswer:
        for t in self.world.read()["router"]["tiers"].values():
            if alias in t["aliases"] and t["url"] and t["state"] == "ready":
                models = self.engine.models(t["url"])
                if models:
                    serving = self.engine._serving(t["url"]) or {}
                    return RoutedAnswer(200, alias if serving.get("echo_model") else models[0].id, "ok")
                return RoutedAnswer(503, None)
        return RoutedAnswer(404, None)

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        """Holds when the tier is ready at `url` and a routed chat answers from expected_model."""
        t = self.world.read()["router"]["tiers"].get(tier) or {}

        def verdict(reason: str = "") -> RouteCheck:
            return RouteCheck(tier, url, expected_model, holds=not reason, reason=reason)

        if t.get("url") != url:
            return verdict(f"fake tier {tier!r} points at {t.get('url')!r}")
        if t.get("state") != "ready":
            return verdict(f"fake tier {tier!r} is {t.get('state')}")
        answer = self.routed_chat(t["aliases"][0]) if t.get("aliases") else RoutedAnswer(404, None)
        if answer.status != 200 or answer.model != expected_model:
            return verdict(f"routed chat answered {answer.status} from {answer.model!r}")
        return verdict()

    def ready(self) -> bool:
        return bool(self.world.read()["router"]["ready"])

    def view(self, tier: str) -> dict[str, Any]:
        """The same shape as the smg adapter's view; only admitted (ready) backends are listed."""
        t = self.world.read()["router"]["tiers"].get(tier) or {}
        backends = []
        if t.get("url") and t.get("state") == "ready":
            models = [m.id for m in self.engine.models(t["url"])]
            backends.append(
                {
                    "url": t["url"],
                    "aliases": t.get("aliases", []),
                    "observed_model": models[0] if models else None,
                    "healthy": self.engine.health(t["url"], "/health"),
                    "state": t["state"],
                }
            )
        return {"router": "fake", "tier": tier, "ready": self.ready(), "backends": backends}


class FakeGpus:
    """GPU readings: each running fake container holds its FAKE_VRAM_MIB on each of its GPUs."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def gpus(self) -> list[GpuReading]:
        w = self.world.read()
        readings = []
        for i, g in enumerate(w["gpus"]):
            used = sum(
                c["vram_mib"]
                for c in w["containers"].values()
                if c["status"] == "running" and g["uuid"] in c["gpu_uuids"]
            )
            readings.append(GpuReading(g["uuid"], g["name"], i, g["total_mib"], used, g["total_mib"] - used))
        return readings

    def driver_version(self) -> str:
        return "fake"


class FakeSharedMemory:
    """SharedMemory over the fake world's `residue` list, with the real adapter's rule.

    An entry is `{"path", "size"}` plus, optionally, `"pids"` (processes of managed
    containers holding it: ours, in use, not residue yet) and `"ours": false` (another
    program's file, e.g. a database's segment: never reported, never removed).
    """

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def residue(self) -> list[ResidueFile]:
        return [
            ResidueFile(r["path"], r["size"])
            for r in self.world.read()["residue"]
            if r.get("ours", True) and not r.get("pids")
        ]

    def remove_unheld(self) -> ResidueRemoval:
        """Our unheld files go; held ones stay with the reason; other programs' are untouched."""
        removed: list[str] = []
        kept: list[tuple[str, str]] = []
        with self.world.edit() as w:
            left = []
            for r in w["residue"]:
                if not r.get("ours", True):
                    left.append(r)
                elif r.get("pids"):
                    left.append(r)
                    kept.append((r["path"], f"mapped or open by pids {sorted(r['pids'])}"))
                else:
                    removed.append(r["path"])
            w["residue"] = left
        return ResidueRemoval(removed=tuple(removed), kept=tuple(kept))


class MemoryShmLedger:
    """ShmLedger in memory: what a scanner marked, for tests of the residue rule."""

    def __init__(self, marks: list[ShmMark] | None = None) -> None:
        self.recorded: list[ShmMark] = list(marks or [])

    def marks(self, boot_id: str) -> list[ShmMark]:
        return [m for m in self.recorded if m.boot_id == boot_id]

    def remember(self, marks: list[ShmMark]) -> None:
        """Like the store: one mark per (boot, path, device, inode), the first holder's."""
        known = {(m.boot_id, m.path, m.dev, m.ino) for m in self.recorded}
        for m in marks:
            if (m.boot_id, m.path, m.dev, m.ino) not in known:
                known.add((m.boot_id, m.path, m.dev, m.ino))
                self.recorded.append(m)


class FakeAcceptanceResult:
    def __init__(self, checks: dict[str, bool], model: str | None) -> None:
        self.checks = checks
        self.model = model

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def failed_checks(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok]

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": self.checks, "model": self.model}


def fake_acceptance(router: Any) -> Any:
    """Real-client acceptance stand-in: the routed answer must come from the expected model."""

    def run(alias: str, expected_model: str) -> FakeAcceptanceResult:
        _maybe_hang_or_fail(router.world, "acceptance")
        answer = router.routed_chat(alias)
        ok = answer.status == 200 and answer.model == expected_model
        return FakeAcceptanceResult({"plain_chat": ok, "streaming_chat": ok, "tool_call": ok}, answer.model)

    return run
