"""Who we are (pid, host, boot id) and whether a recorded owner is still alive."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from anvil_ctl.core.ports import Owner


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def current_owner() -> Owner:
    return Owner(pid=os.getpid(), hostname=socket.gethostname(), boot_id=boot_id())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; it only waits to be reaped.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def owner_alive(owner: Owner, me: Owner | None = None) -> bool | None:
    """True/False when it can be known from this host; None for another host's owner. `me` names
    this host by its fleet name; an owner under this machine's hostname is local too."""
    me = me or current_owner()
    if owner.hostname not in (me.hostname, socket.gethostname()):
        return None
    if owner.boot_id != me.boot_id:
        return False  # the host rebooted since: every process of that boot is gone
    return pid_alive(owner.pid)
