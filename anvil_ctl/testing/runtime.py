"""Fake container runtime, engine probe, GPUs and shared memory over the fake world."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from anvil_ctl.core.errors import NotFound, TransientError
from anvil_ctl.core.model import (
    LABEL_SERVED_MODEL,
    ContainerInfo,
    ContainerLog,
    ContainerSpec,
    ContainerStatus,
    GpuReading,
    ImageInfo,
    ModelCard,
    PromptAnswer,
    ResidueFile,
    ResidueRemoval,
    config_fingerprint,
)
from anvil_ctl.testing.world import ContainerDoc, FakeWorld, maybe_hang_or_fail


class FakeRuntime:
    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def _info(self, c: ContainerDoc) -> ContainerInfo:
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
        wanted = (labels or {}).items()
        containers = self.world.read()["containers"].values()
        return [self._info(c) for c in containers if all(c["labels"].get(k) == v for k, v in wanted)]

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
            env, labels = dict(spec.env), dict(spec.labels)
            w["containers"][cid] = {
                "id": cid,
                "name": spec.name,
                "image_id": image.id,
                "image_ref": spec.image,
                "status": "created",
                "labels": dict(spec.labels),
                "fingerprint": config_fingerprint(spec.fingerprint_fields()),
                "gpu_uuids": list(spec.gpu_uuids),
                "served_model": env.get("FAKE_SERVED_MODEL") or labels.get(LABEL_SERVED_MODEL, ""),
                "max_model_len": int(env.get("FAKE_MAX_MODEL_LEN", "0") or 0),
                "healthy": env.get("FAKE_FAIL_HEALTH") != "1",
                "vram_mib": int(env.get("FAKE_VRAM_MIB", "0") or 0),
                "binding": env.get("FAKE_BINDING") or labels.get("io.anvil.binding", ""),
                "no_health_route": env.get("FAKE_NO_HEALTH_ROUTE") == "1",
                "echo_model": env.get("FAKE_ECHO_MODEL") == "1",
            }
        maybe_hang_or_fail(self.world, "create")
        return cid

    def _set_status(self, container_id: str, status: ContainerStatus) -> None:
        with self.world.edit() as w:
            c = w["containers"].get(container_id)
            if c is None:
                raise NotFound(f"container {container_id} not found", container_id=container_id)
            c["status"] = status

    def start(self, container_id: str) -> None:
        self._set_status(container_id, "running")
        maybe_hang_or_fail(self.world, "start")

    def stop(self, container_id: str, timeout_s: float) -> None:
        self._set_status(container_id, "exited")
        maybe_hang_or_fail(self.world, "stop")

    def remove(self, container_id: str) -> None:
        with self.world.edit() as w:
            if w["containers"].pop(container_id, None) is None:
                raise NotFound(f"container {container_id} not found", container_id=container_id)

    def logs(
        self, container_id: str, *, max_lines: int, max_bytes: int, since: float | None = None
    ) -> ContainerLog:
        """The container's `log` lines (`ContainerDoc.log`); with `since`, the lines appended at
        that Unix time or later."""
        c = self.world.read()["containers"].get(container_id)
        if c is None:
            raise NotFound(f"container {container_id} not found", container_id=container_id)
        times = c.get("log_at", [])
        lines = [
            line
            for i, line in enumerate(c.get("log", []))
            if since is None or (i < len(times) and times[i] >= since)
        ][-(max_lines + 1) :]
        tail = "".join(line + "\n" for line in lines).encode()
        return replace(
            ContainerLog.bounded(tail, max_lines=max_lines, max_bytes=max_bytes), status=c["status"]
        )


class FakeServerProbe:
    """Answers for the running fake container whose binding matches the URL."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def serving_container(self, base_url: str) -> ContainerDoc | None:
        binding = base_url.removeprefix("http://").rstrip("/")
        containers = self.world.read()["containers"].values()
        return next((c for c in containers if c["status"] == "running" and c["binding"] == binding), None)

    def listening(self, base_url: str) -> bool:
        return self.serving_container(base_url) is not None

    def health(self, base_url: str, path: str) -> bool:
        c = self.serving_container(base_url)
        return bool(c and c["healthy"] and not c.get("no_health_route"))

    def models(self, base_url: str) -> list[ModelCard]:
        c = self.serving_container(base_url)
        if c is None:
            return []
        return [ModelCard(c["served_model"], c["max_model_len"] or None)]

    def running(self, base_url: str, metric: str) -> int | None:
        c = self.serving_container(base_url)
        return None if c is None else self.look_in_flight(c)

    def look_in_flight(self, c: ContainerDoc) -> int:
        """The container's requests in flight (see `ContainerDoc.in_flight`)."""
        with self.world.edit() as w:
            doc = w["containers"][c["id"]]
            count = doc.get("in_flight", 0)
            if count and not doc.get("in_flight_stuck"):
                doc["in_flight"] = count - 1
        return count

    def probe_prompt(self, base_url: str, model: str, words: int) -> PromptAnswer:
        """Refuses a prompt at or above the container's max_model_len the way llama.cpp does."""
        c = self.serving_container(base_url)
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

    An entry is `{"path", "size"}`, optionally `"pids"` (held: not residue yet) and `"ours": false`
    (another program's file: never reported, never removed).
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
        with self.world.edit() as w:
            ours = [r for r in w["residue"] if r.get("ours", True)]
            removed = tuple(r["path"] for r in ours if not r.get("pids"))
            kept = tuple(
                (r["path"], f"mapped or open by pids {sorted(r['pids'])}") for r in ours if r.get("pids")
            )
            w["residue"] = [r for r in w["residue"] if not r.get("ours", True) or r.get("pids")]
        return ResidueRemoval(removed=removed, kept=kept)
