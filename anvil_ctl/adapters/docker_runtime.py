"""ContainerRuntime on the Docker Engine through the `docker` SDK; containers by exact ID.

Only idempotent calls are retried: a lost answer to a create or remove must not be repeated
blindly. GPU modes: "nvidia" (a DeviceRequest, needs the NVIDIA Container Toolkit), "devices"
(device nodes and driver libraries, `nvidia_devices`), "simulated" (env only); "auto" picks
nvidia or devices at the first create.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal, cast, get_args

import docker
import docker.errors
from docker.types import DeviceRequest, Ulimit
from docker.types import Mount as DockerMount
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from anvil_ctl.adapters import nvidia_devices
from anvil_ctl.adapters.docker_fingerprint import (
    GPU_ENV,
    LABEL_GPU_LIBRARIES,
    arr,
    inspect_fingerprint_fields,
    integer,
    obj,
    spec_labels,
    text,
)
from anvil_ctl.core.errors import AdapterError, BadInput, NotFound, TransientError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import (
    LABEL_PREFIX,
    ContainerInfo,
    ContainerLog,
    ContainerSpec,
    ContainerStatus,
    ImageInfo,
    config_fingerprint,
)
from anvil_ctl.log import get_logger

GpuMode = Literal["nvidia", "devices", "simulated", "auto"]
STOPPED = frozenset({"exited", "created", "dead"})
log = get_logger()

_retry = retry(
    retry=retry_if_exception_type(TransientError),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.1, max=1.0),
    reraise=True,
)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Map docker SDK and transport errors to the core tree, at this edge only."""
    try:
        yield
    except docker.errors.NotFound as exc:
        raise NotFound(f"{what}: not found", detail=str(exc)) from exc
    except docker.errors.APIError as exc:
        status = exc.status_code or 0
        if status >= 500:
            raise TransientError(
                f"{what}: Docker API {status}", dependency="docker", detail=str(exc)
            ) from exc
        raise AdapterError(f"{what}: Docker API {status}: {exc.explanation}", status=status) from exc
    except docker.errors.DockerException as exc:
        raise AdapterError(f"{what}: {exc}") from exc
    except OSError as exc:  # requests' ConnectionError/Timeout derive from OSError
        raise TransientError(f"{what}: cannot reach the Docker Engine: {exc}", dependency="docker") from exc


LABEL_HOST = LABEL_PREFIX + "host"  # the fleet host that created a container


class DockerRuntime:
    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        base_url: str | None = None,
        gpu_mode: GpuMode = "nvidia",
        host: str | None = None,
    ) -> None:
        """Use `client`, else connect to base_url (None: DOCKER_HOST). Containers labelled for another
        fleet `host` are not listed."""
        if gpu_mode not in get_args(GpuMode):
            raise BadInput(f"gpu_mode must be one of {', '.join(get_args(GpuMode))}, not {gpu_mode!r}")
        self.gpu_mode: GpuMode = gpu_mode
        self.host = host
        self._client = client if client is not None else _connect(base_url, 60.0)

    def close(self) -> None:
        self._client.close()

    @_retry
    def inspect(self, container_id: str) -> ContainerInfo:
        return self._info(self._exact(container_id), {})

    def _exact(self, container_id: str) -> JSONObject:
        """Inspect data of the container whose full ID is container_id (no names, no prefixes)."""
        with translated(f"inspect container {container_id}"):
            attrs: JSONObject = self._client.api.inspect_container(container_id)
        if attrs.get("Id") != container_id:
            raise NotFound(
                f"container {container_id}: no container has this exact ID",
                resolved=attrs.get("Id"),
            )
        return attrs

    @_retry
    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        filters = {"label": [f"{k}={v}" for k, v in (labels or {}).items()]} if labels else None
        with translated("list containers"):
            summaries = self._client.api.containers(all=True, filters=filters)
        infos: list[ContainerInfo] = []
        images: dict[str, JSONObject | None] = {}
        for summary in summaries:
            try:
                with translated(f"inspect container {summary['Id']}"):
                    attrs: JSONObject = self._client.api.inspect_container(summary["Id"])
            except NotFound:
                continue  # removed between list and inspect
            info = self._info(attrs, images)
            if self.host is None or info.labels.get(LABEL_HOST, self.host) == self.host:
                infos.append(info)
        return sorted(infos, key=lambda i: i.id)

    @_retry
    def image(self, ref: str) -> ImageInfo:
        with translated(f"image {ref}"):
            attrs: JSONObject = self._client.api.inspect_image(ref)
        return ImageInfo(
            id=str(attrs["Id"]),
            repo_digests=_texts(attrs.get("RepoDigests")),
            tags=_texts(attrs.get("RepoTags")),
        )

    def _image_attrs(self, image_id: str, cache: dict[str, JSONObject | None]) -> JSONObject | None:
        if image_id not in cache:
            try:
                with translated(f"image {image_id}"):
                    cache[image_id] = self._client.api.inspect_image(image_id)
            except NotFound:
                cache[image_id] = None  # image deleted under a container: fingerprint without it
        return cache[image_id]

    def _info(self, attrs: JSONObject, cache: dict[str, JSONObject | None]) -> ContainerInfo:
        image = self._image_attrs(str(attrs["Image"]), cache)
        fields, gpus = inspect_fingerprint_fields(attrs, obj(image.get("Config")) if image else None)
        state, config = obj(attrs.get("State")), obj(attrs.get("Config"))
        status = cast(ContainerStatus, state.get("Status", "dead"))
        return ContainerInfo(
            id=str(attrs["Id"]),
            name=text(attrs.get("Name", "")).lstrip("/"),
            image_id=str(attrs["Image"]),
            image_ref=text(config.get("Image", "")),
            status=status,
            labels={k: text(v) for k, v in obj(config.get("Labels")).items()},
            fingerprint=config_fingerprint(fields),
            repo_digests=_texts(image.get("RepoDigests") if image else None),
            gpu_uuids=tuple(gpus),
            exit_code=integer(state.get("ExitCode")) if status in STOPPED else None,
            pid=integer(state.get("Pid")) or None,
        )

    def resolved_gpu_mode(self) -> GpuMode:
        """The GPU mode in force: "auto" resolved once, by whether the engine has an `nvidia` runtime."""
        if self.gpu_mode == "auto":
            with translated("docker info"):
                runtimes = obj(self._client.info().get("Runtimes"))
            self.gpu_mode = "nvidia" if "nvidia" in runtimes else "devices"
            log.info("docker.gpu_mode", gpu_mode=self.gpu_mode, runtimes=sorted(runtimes))
        return self.gpu_mode

    def create(self, spec: ContainerSpec) -> str:
        env = dict(spec.env)
        if self.gpu_mode == "simulated" and GPU_ENV in env:
            raise BadInput(f"env {GPU_ENV} is reserved for simulated GPUs; use gpu_uuids")
        if self.gpu_mode == "simulated" and spec.gpu_uuids:
            env[GPU_ENV] = ",".join(spec.gpu_uuids)
        labels = {**spec_labels(spec), **dict(spec.labels)}
        if self.host is not None:
            labels.setdefault(LABEL_HOST, self.host)
        kwargs: dict[str, object] = {
            "image": spec.image,
            "name": spec.name,
            "command": list(spec.command) or None,
            "entrypoint": list(spec.entrypoint) if spec.entrypoint is not None else None,
            "environment": [f"{k}={v}" for k, v in env.items()],
            "labels": labels,
            "mounts": [
                DockerMount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
                for m in spec.mounts
            ],
            "network_mode": spec.network_mode,
            "init": spec.init,
            "detach": True,
        }
        optional = {
            "ports": {f"{port}/tcp": _host_binding(host) for port, host in spec.ports} or None,
            "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, s, h in spec.ulimits] or None,
            "shm_size": spec.shm_size,
            "ipc_mode": spec.ipc_mode,
        }
        kwargs |= {k: v for k, v in optional.items() if v is not None}
        mode = self.resolved_gpu_mode() if spec.gpu_uuids else self.gpu_mode
        if mode == "nvidia" and spec.gpu_uuids:
            kwargs["device_requests"] = [
                DeviceRequest(device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]])
            ]
        if mode == "devices" and spec.gpu_uuids:
            kwargs["devices"] = nvidia_devices.device_nodes(spec.gpu_uuids, nvidia_devices.gpu_nodes())
            libraries = nvidia_devices.library_mounts(
                nvidia_devices.driver_libraries(nvidia_devices.read_ldconfig_cache()),
                [(m.source, m.target) for m in spec.mounts],
            )
            kwargs["mounts"] = [
                *cast(list[DockerMount], kwargs["mounts"]),
                *(DockerMount(target=lib, source=lib, type="bind", read_only=True) for lib in libraries),
            ]
            labels[LABEL_GPU_LIBRARIES] = ",".join(libraries)
        with translated(f"create container {spec.name}"):
            container = self._client.containers.create(**kwargs)
        container_id = str(container.id)
        log.info("container.created", container_id=container_id, name=spec.name, image=spec.image)
        return container_id

    @_retry
    def start(self, container_id: str) -> None:
        self._exact(container_id)
        with translated(f"start container {container_id}"):
            self._client.api.start(container_id)
        log.info("container.started", container_id=container_id)

    @_retry
    def stop(self, container_id: str, timeout_s: float) -> None:
        """SIGTERM, SIGKILL after timeout_s; return only once inspect reports it not running."""
        grace = max(int(timeout_s + 0.999), 0)
        self._exact(container_id)
        with translated(f"stop container {container_id}"):
            self._client.api.stop(container_id, timeout=grace)
        if self._wait_stopped(container_id, deadline_s=10.0):
            log.info("container.stopped", container_id=container_id)
            return
        log.warning("container.stop_unconfirmed_killing", container_id=container_id)
        with translated(f"kill container {container_id}"):
            try:
                self._client.api.kill(container_id)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: it stopped meanwhile
                    raise
        if not self._wait_stopped(container_id, deadline_s=10.0):
            status = self._status(container_id)
            raise AdapterError(
                f"container {container_id} still {status} after stop and kill",
                container_id=container_id,
                status=status,
            )

    def _status(self, container_id: str) -> str:
        attrs = self._exact(container_id)
        return str(obj(attrs.get("State")).get("Status", "dead"))

    def _wait_stopped(self, container_id: str, deadline_s: float) -> bool:
        deadline = time.monotonic() + deadline_s
        while True:
            if self._status(container_id) in STOPPED:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    @_retry
    def logs(
        self, container_id: str, *, max_lines: int, max_bytes: int, since: float | None = None
    ) -> ContainerLog:
        """The newest lines of the container's output since creation (or the Unix time `since`), bounded."""
        attrs = self._exact(container_id)
        state = obj(attrs.get("State"))
        window = bytearray()
        cut = False
        with translated(f"logs of container {container_id}"):
            stream = self._client.api.logs(
                container_id,
                stdout=True,
                stderr=True,
                stream=True,
                follow=False,
                tail=max_lines + 1,
                **({"since": since} if since is not None else {}),
            )
            try:
                for chunk in stream:
                    window += chunk
                    if len(window) > 2 * max_bytes:
                        del window[: len(window) - max_bytes]
                        cut = True
            finally:
                close = getattr(stream, "close", None)
                if callable(close):
                    close()
        status = str(state.get("Status", "dead"))
        return replace(
            ContainerLog.bounded(bytes(window), max_lines=max_lines, max_bytes=max_bytes, cut=cut),
            restart_count=integer(attrs.get("RestartCount") or 0) or 0,
            oom_killed=bool(state.get("OOMKilled")),
            status=status,
            started_at=str(state.get("StartedAt") or ""),
            exit_code=integer(state.get("ExitCode")) if status in STOPPED else None,
        )

    def remove(self, container_id: str, *, force: bool = False) -> None:
        """Remove one container by exact ID; a running one is refused unless force."""
        self._exact(container_id)
        with translated(f"remove container {container_id}"):
            self._client.api.remove_container(container_id, v=True, force=force)
        log.info("container.removed", container_id=container_id)


def _connect(base_url: str | None, timeout_s: float) -> docker.DockerClient:
    """A DockerClient at the server's own API version (`version="auto"` leaks its socket on failure)."""
    kwargs: dict[str, object] = (
        {"base_url": base_url} if base_url is not None else docker.utils.kwargs_from_env()
    )
    kwargs["timeout"] = int(timeout_s)
    url = str(kwargs.get("base_url") or "")
    if url.startswith(("unix://", "http+unix://")) and not os.path.exists(url.split("://", 1)[1]):
        raise TransientError(f"connect to the Docker Engine: no socket at {url}", dependency="docker")
    with translated("connect to the Docker Engine"):
        with docker.APIClient(version="1.24", **kwargs) as probe:
            version = str(probe.version(api_version=False)["ApiVersion"])
        return docker.DockerClient(version=version, **kwargs)


def _texts(value: JSONValue) -> tuple[str, ...]:
    """A list of text (repo digests, tags) from inspect data, sorted."""
    return tuple(sorted(str(v) for v in arr(value)))


def _host_binding(host: str) -> tuple[str, int] | int:
    """ "127.0.0.1:8001" -> ("127.0.0.1", 8001); "8001" -> 8001."""
    ip, sep, port = host.rpartition(":")
    return (ip, int(port)) if sep else int(port)
