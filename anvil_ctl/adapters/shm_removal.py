"""Removing shared-memory residue: two observations must agree a file is ours and unheld."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from anvil_ctl.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class SeenFile:
    """One file of ours as observed: its inode identity and content stamp, and who holds it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    pids: tuple[int, ...]
    """Processes of managed containers holding it (others make a file not ours)."""


@dataclass(frozen=True)
class Observation:
    """One scan: our files by path (held or not) and how many processes could not be inspected."""

    files: dict[str, SeenFile] = field(default_factory=dict)
    unreadable_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class RemovalReport:
    """What a removal removed, and every residue file it kept with the reason."""

    removed: tuple[str, ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    unreadable_pids: tuple[int, ...] = ()


class Observer(Protocol):
    """What `remove_residue` needs of a scanner (an `anvil_ctl.adapters.shm.ShmScanner`)."""

    def observe(self) -> Observation: ...


def remove_residue(
    scanner: Observer,
    *,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    allow_unreadable: bool = False,
) -> RemovalReport:
    """Delete our residue only when two observations `interval_s` apart agree nobody holds it.

    Same inode, size and mtime, ours and unheld both times. Any unreadable process removes
    nothing, unless `allow_unreadable` (some sandboxes deny even root PID 1's maps).
    """
    first = scanner.observe()
    sleep(interval_s)
    second = scanner.observe()
    unreadable = tuple(sorted(set(first.unreadable_pids) | set(second.unreadable_pids)))
    removed: list[str] = []
    kept: list[tuple[str, str]] = []
    for path in sorted(set(first.files) | set(second.files)):
        reason = _keep_reason(path, first, second, () if allow_unreadable else unreadable)
        if reason is None:
            reason = _unlink_if_unchanged(path, second.files[path])
        if reason is None:
            removed.append(path)
            log.info("shm.residue_removed", path=path, size=second.files[path].size)
        else:
            kept.append((path, reason))
    return RemovalReport(removed=tuple(removed), kept=tuple(kept), unreadable_pids=unreadable)


def _keep_reason(
    path: str, first: Observation, second: Observation, unreadable: tuple[int, ...]
) -> str | None:
    a, b = first.files.get(path), second.files.get(path)
    if a is None:
        return "appeared between observations"
    if b is None:
        return "vanished between observations"
    pids = sorted(set(a.pids) | set(b.pids))
    if pids:
        return f"mapped or open by pids {pids}"
    if (a.dev, a.ino, a.size, a.mtime_ns) != (b.dev, b.ino, b.size, b.mtime_ns):
        return "changed between observations"
    if unreadable:
        return f"holders unknown: {len(unreadable)} processes could not be inspected"
    return None


def _unlink_if_unchanged(path: str, seen: SeenFile) -> str | None:
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (
            seen.dev,
            seen.ino,
            seen.size,
            seen.mtime_ns,
        ):
            return "changed before removal"
        os.unlink(path)
    except FileNotFoundError:
        return "vanished before removal"
    except OSError as exc:
        return f"cannot remove: {exc.strerror}"
    return None
