"""Config fingerprint of a container from its Docker inspect data (pure, no I/O).

It must equal the creating spec's `fingerprint_fields()`, although Docker merges the image's
Env/Cmd/Entrypoint and fills defaults: a field the spec left to defaults (recorded in labels
at create) counts as "default" only while its observed value is still Docker's default.
"""

from __future__ import annotations

import re

from anvil_ctl.core.jsontypes import JSONArray, JSONObject, JSONValue
from anvil_ctl.core.model import LABEL_PREFIX, ContainerSpec, fingerprint_fields

LABEL_GPUS = LABEL_PREFIX + "gpus"
LABEL_GPU_LIBRARIES = LABEL_PREFIX + "gpu.libraries"
"""Driver libraries the adapter mounted for a "devices" GPU container: not the spec's mounts."""
LABEL_ENV_KEYS = LABEL_PREFIX + "spec.env-keys"
LABEL_DEFAULTS = LABEL_PREFIX + "spec.defaults"
LABEL_SHM_SIZE = LABEL_PREFIX + "spec.shm-size"
GPU_ENV = "NVIDIA_VISIBLE_DEVICES"
DEFAULT_SHM_BYTES = 64 * 1024 * 1024
DEFAULT_IPC_MODES = frozenset({"", "private", "shareable"})

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def obj(value: JSONValue) -> JSONObject:
    """`value` as a JSON object; {} for null, absent or another type."""
    return value if isinstance(value, dict) else {}


def arr(value: JSONValue) -> JSONArray:
    """`value` as a JSON array; [] for null, absent or another type."""
    return value if isinstance(value, list) else []


def text(value: JSONValue, default: str = "") -> str:
    """`value` as text: `default` for null, str() of anything else."""
    return default if value is None else str(value)


def integer(value: JSONValue) -> int | None:
    """`value` as an integer (a number or its text); None for null or another type."""
    if isinstance(value, int | float | str):
        return int(value)
    return None


def size_bytes(value: str | int) -> int:
    """Docker's RAMInBytes: "16g" -> 17179869184 (binary units, case-insensitive)."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def spec_labels(spec: ContainerSpec) -> dict[str, str]:
    """The labels that let inspect data be mapped back to the spec's fingerprint fields."""
    left_to_docker = {
        "command": not spec.command and spec.entrypoint is None,  # only then is Cmd the image's
        "entrypoint": spec.entrypoint is None,
        "shm_size": spec.shm_size is None,
        "ipc_mode": spec.ipc_mode is None,
    }
    labels = {
        LABEL_ENV_KEYS: ",".join(sorted(k for k, _ in spec.env)),
        LABEL_DEFAULTS: ",".join(field for field, left in left_to_docker.items() if left),
        LABEL_GPUS: ",".join(spec.gpu_uuids),
    }
    if spec.shm_size is not None:
        labels[LABEL_SHM_SIZE] = spec.shm_size
    return labels


def _env(items: JSONValue) -> dict[str, str]:
    return dict(str(item).partition("=")[::2] for item in arr(items))


def _scalar(value: JSONValue) -> str | int:
    """An int or a string as it is (Docker sends these); str() of anything else."""
    return value if isinstance(value, str | int) and not isinstance(value, bool) else str(value)


def _mounts(host_config: JSONObject) -> list[dict[str, str | bool]]:
    mounts: list[dict[str, str | bool]] = [
        {
            "source": text(m.get("Source", "")),
            "target": text(m.get("Target", "")),
            "read_only": bool(m.get("ReadOnly")),
        }
        for m in map(obj, arr(host_config.get("Mounts")))
    ]
    for bind in arr(host_config.get("Binds")):
        parts = str(bind).split(":")
        mode = parts[2] if len(parts) > 2 else ""
        mounts.append({"source": parts[0], "target": parts[1], "read_only": "ro" in mode.split(",")})
    return mounts


def _ports(host_config: JSONObject) -> list[list[int | str]]:
    ports: list[list[int | str]] = []
    for key, bindings in obj(host_config.get("PortBindings")).items():
        container_port = int(key.split("/")[0])
        for b in map(obj, arr(bindings)):
            host = f"{b['HostIp']}:{b['HostPort']}" if b.get("HostIp") else str(b.get("HostPort", ""))
            ports.append([container_port, host])
    return ports


def inspect_fingerprint_fields(
    attrs: JSONObject, image_config: JSONObject | None
) -> tuple[dict[str, object], list[str]]:
    """(fingerprint fields, GPU UUIDs) from a container's inspect data and its image's Config."""
    cfg, hc = obj(attrs.get("Config")), obj(attrs.get("HostConfig"))
    labels = obj(cfg.get("Labels"))
    img: JSONObject = image_config or {}
    defaults = set(text(labels.get(LABEL_DEFAULTS)).split(","))
    spec_keys = {k for k in text(labels.get(LABEL_ENV_KEYS)).split(",") if k}

    adapter_mounts = {t for t in text(labels.get(LABEL_GPU_LIBRARIES)).split(",") if t}
    img_env = _env(img.get("Env"))
    env = {k: v for k, v in _env(cfg.get("Env")).items() if k in spec_keys or img_env.get(k) != v}
    gpus: list[str] = []
    for req in map(obj, arr(hc.get("DeviceRequests"))):
        if ["gpu"] in arr(req.get("Capabilities")):
            gpus.extend(str(d) for d in arr(req.get("DeviceIDs")))
    if any(
        re.fullmatch(r"/dev/nvidia\d+", text(d.get("PathInContainer")))
        for d in map(obj, arr(hc.get("Devices")))
    ):
        # GPUs given as device nodes ("devices" mode): the label names them by UUID
        gpus.extend(u for u in text(labels.get(LABEL_GPUS)).split(",") if u)
    if GPU_ENV in env and GPU_ENV not in spec_keys:
        # simulated GPUs: the adapter put them there, they are not the spec's env
        gpus.extend(u for u in env.pop(GPU_ENV).split(",") if u)

    command = [str(c) for c in arr(cfg.get("Cmd"))]
    if "command" in defaults and command == arr(img.get("Cmd")):
        command = []
    entrypoint = cfg.get("Entrypoint")
    if "entrypoint" in defaults and entrypoint == img.get("Entrypoint"):
        entrypoint = None

    shm_observed = integer(hc.get("ShmSize") or 0) or 0
    shm: str | int | None = shm_observed
    declared = labels.get(LABEL_SHM_SIZE)
    if declared is not None and size_bytes(str(declared)) == shm_observed:
        shm = str(declared)
    elif "shm_size" in defaults and shm_observed in (0, DEFAULT_SHM_BYTES):
        shm = None

    ipc: str | None = text(hc.get("IpcMode") or "")
    if "ipc_mode" in defaults and ipc in DEFAULT_IPC_MODES:
        ipc = None

    fields = fingerprint_fields(
        image=text(cfg.get("Image", "")),
        command=command,
        entrypoint=[str(e) for e in arr(entrypoint)] if entrypoint is not None else None,
        env=env,
        mounts=[m for m in _mounts(hc) if m["target"] not in adapter_mounts],
        ports=_ports(hc),
        gpu_uuids=gpus,
        shm_size=shm,
        ipc_mode=ipc,
        ulimits=[
            [_scalar(u.get("Name")), _scalar(u.get("Soft")), _scalar(u.get("Hard"))]
            for u in map(obj, arr(hc.get("Ulimits")))
        ],
        network_mode=text(hc.get("NetworkMode", "")),
    )
    return fields, sorted(gpus)
