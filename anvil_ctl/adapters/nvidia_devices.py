"""What a GPU engine's container needs where Docker has no NVIDIA runtime: the control nodes and
`/dev/nvidiaN` per granted GPU, and the driver's libraries mounted read-only where the host's
loader finds them (read from /proc/driver/nvidia and `ldconfig -p`)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from anvil_ctl.core.errors import AdapterError

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Nodes every CUDA process opens besides its GPUs' own (those missing on a host are left out)."""

DRIVER_LIBRARIES = re.compile(
    r"^lib(?:cuda|cudadebugger|nvidia-ml|nvidia-ptxjitcompiler|nvidia-nvvm|nvidia-cfg"
    r"|nvidia-allocator)\.so\.\d+$|^libnvidia-gpucomp\.so\.[\d.]+$"
)
"""The driver's compute libraries by soname, as the NVIDIA Container Toolkit's `compute` and
`utility` capabilities list them."""

_LDCONFIG_LINE = re.compile(r"^\s*(?P<name>\S+) \((?P<flags>[^)]*)\) => (?P<path>\S+)$")


@dataclass(frozen=True)
class GpuNode:
    uuid: str
    minor: int

    @property
    def path(self) -> str:
        return f"/dev/nvidia{self.minor}"


def gpu_nodes(proc_driver: Path = Path("/proc/driver/nvidia/gpus")) -> dict[str, GpuNode]:
    """Every GPU the kernel driver lists, by lower-case UUID."""
    nodes: dict[str, GpuNode] = {}
    for info in sorted(proc_driver.glob("*/information")):
        pairs = (line.partition(":") for line in info.read_text().splitlines())
        fields = {key.strip(): value.strip() for key, sep, value in pairs if sep}
        uuid, minor = fields.get("GPU UUID"), fields.get("Device Minor")
        if uuid and minor and minor.isdigit():
            nodes[uuid.lower()] = GpuNode(uuid=uuid, minor=int(minor))
    return nodes


def device_nodes(
    uuids: Sequence[str],
    nodes: dict[str, GpuNode],
    *,
    exists: Iterable[str] | None = None,
) -> list[str]:
    """Docker `devices` entries (`host:container:rwm`) for the GPUs `uuids` and the control nodes;
    a UUID the driver does not list is an error naming it."""
    missing = [u for u in uuids if u.lower() not in nodes]
    if missing:
        raise AdapterError(
            f"GPU {', '.join(missing)} is not listed by the NVIDIA driver (/proc/driver/nvidia/gpus)",
            gpus=sorted(nodes),
        )
    present = set(exists) if exists is not None else None
    control = [n for n in CONTROL_NODES if (Path(n).exists() if present is None else n in present)]
    paths = [*control, *(nodes[u.lower()].path for u in uuids)]
    return [f"{p}:{p}:rwm" for p in paths]


def driver_libraries(ldconfig_cache: str) -> list[str]:
    """The host paths of the driver's libraries in `ldconfig -p` output, the loader's first
    choice for each soname (ldconfig lists it first), sorted."""
    chosen: dict[str, str] = {}
    for line in ldconfig_cache.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m and "x86-64" in m["flags"] and DRIVER_LIBRARIES.match(m["name"]):
            chosen.setdefault(m["name"], m["path"])
    return sorted(chosen.values())


def read_ldconfig_cache() -> str:
    """`ldconfig -p` of this host ('' where there is no ldconfig: no library is mounted)."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            return subprocess.run(
                [ldconfig, "-p"], check=True, capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return ""


def library_mounts(libraries: Sequence[str], mounts: Iterable[tuple[str, str]]) -> list[str]:
    """The libraries a container does not already see through its mounts ((source, target)
    pairs): a mount that shows a host directory at the same path covers what is under it."""
    same = [s.rstrip("/") for s, t in mounts if s.rstrip("/") == t.rstrip("/")]
    return [lib for lib in libraries if not any(lib.startswith(d + "/") for d in same)]
