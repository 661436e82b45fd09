"""Which Docker container a host process runs in, read from /proc (real GPUs only)."""

from __future__ import annotations

import re
from pathlib import Path

_CONTAINER_ID = re.compile(r"(?:docker[-/]|/)([0-9a-f]{64})(?:\.scope)?\b")


def proc_cgroup_container(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The Docker container ID a host PID runs in, from /proc/PID/cgroup (None if none)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    found = _CONTAINER_ID.findall(text)
    return found[-1] if found else None
