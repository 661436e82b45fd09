"""Simulated GPUs (`ANVIL_GPU=simulated`): the host config's roles, used memory as stubs report it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx

from anvil_ctl.adapters.docker_fingerprint import LABEL_GPUS
from anvil_ctl.adapters.engine_http import HttpServerProbe
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.errors import AdapterError
from anvil_ctl.core.jsontypes import JSONValue
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_PREFIX, GpuProcess, GpuReading
from anvil_ctl.core.ports import ContainerRuntime
from anvil_ctl.log import get_logger

log = get_logger()

LABEL_PORT = LABEL_PREFIX + "port"
LABEL_BINDING = LABEL_PREFIX + "binding"
SIM_VRAM_PATH = "/anvil/sim/vram"


def _endpoint(labels: Mapping[str, str]) -> str | None:
    binding = labels.get(LABEL_BINDING)
    if binding and ":" in binding:
        host, _, port = binding.rpartition(":")
        return f"http://{host}:{port}"
    port_label = labels.get(LABEL_PORT)
    if port_label and port_label.isdigit():
        return f"http://127.0.0.1:{port_label}"
    return None


def _per_gpu(body: JSONValue) -> dict[str, int]:
    """`{"gpus": {uuid: used_mib}}` as UUID (lower case) -> MiB; a TypeError or ValueError otherwise."""
    gpus = body.get("gpus") if isinstance(body, dict) else None
    if not isinstance(gpus, dict):
        raise TypeError(f"expected an object with an object 'gpus', got {type(body).__name__}")
    return {str(k).lower(): _mib(v) for k, v in gpus.items()}


def _mib(value: JSONValue) -> int:
    if isinstance(value, str | int | float):
        return int(value)
    raise TypeError(f"expected a number of MiB, got {type(value).__name__}")


class SimulatedGpuProbe:
    """GpuProbe over the host config's roles: each running managed container is asked
    `/anvil/sim/vram`, a card's use is the sum (capped at capacity); not answering yet holds nothing."""

    def __init__(
        self,
        roles: Mapping[str, GpuRole],
        runtime: ContainerRuntime,
        http_get: Callable[[str], JSONValue] | None = None,
    ) -> None:
        self.roles = dict(roles)
        self.runtime = runtime
        self._http = HttpServerProbe(timeout_s=2.0)
        self.http_get: Callable[[str], JSONValue] = http_get or self._http.get_json

    def close(self) -> None:
        self._http.close()

    def driver_version(self) -> str:
        return "simulated"

    def _held(self) -> dict[str, list[GpuProcess]]:
        held: dict[str, list[GpuProcess]] = {}
        for info in self.runtime.list(labels={LABEL_MANAGED: "true"}):
            if not info.running:
                continue
            base = _endpoint(info.labels)
            if base is None:
                if info.labels.get(LABEL_GPUS) or info.gpu_uuids:
                    raise AdapterError(
                        f"simulated GPUs: container {info.id[:12]} uses GPUs but has no "
                        f"{LABEL_BINDING} or {LABEL_PORT} label to ask for its memory",
                        container_id=info.id,
                    )
                continue
            url = base + SIM_VRAM_PATH
            try:
                body = self.http_get(url)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
                log.info("gpu.sim_not_answering", container=info.id[:12], error=str(exc))
                continue
            except httpx.HTTPError as exc:
                raise AdapterError(
                    f"simulated GPUs: {url} of container {info.id[:12]} failed: {exc}",
                    container_id=info.id,
                ) from exc
            try:
                per_gpu = _per_gpu(body)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise AdapterError(
                    f'simulated GPUs: {url} answered {body!r}; expected {{"gpus": {{"GPU-uuid": used_mib}}}}',
                    container_id=info.id,
                ) from exc
            for uuid, used in per_gpu.items():
                if used > 0:
                    held.setdefault(uuid, []).append(GpuProcess(pid=info.pid or 0, used_mib=used))
        return held

    def gpus(self) -> list[GpuReading]:
        held = self._held()
        out = []
        for index, (name, role) in enumerate(sorted(self.roles.items())):
            procs = tuple(sorted(held.get(role.uuid.lower(), []), key=lambda p: p.pid))
            used = min(role.capacity_mib, sum(p.used_mib for p in procs))
            out.append(
                GpuReading(
                    uuid=role.uuid,
                    name=role.name or f"Simulated GPU ({name})",
                    index=index,
                    total_mib=role.capacity_mib,
                    used_mib=used,
                    free_mib=role.capacity_mib - used,
                    processes=procs,
                )
            )
        return out
