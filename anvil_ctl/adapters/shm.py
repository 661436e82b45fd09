"""Shared-memory residue: engine files left in /dev/shm and the processes that map or hold them.

Implements `anvil_ctl.core.ports.SharedMemory`. A residue file is a regular file
under the directory (recursively, links not followed) whose path relative to the
directory matches an include glob and no exclude glob. Default: every file except
POSIX named semaphores (`sem.*`, created by glibc's sem_open for any program) and
PulseAudio's `pulse-shm-*`, the system's own users of /dev/shm. Engines' files
(NCCL `nccl-*`, torch `torch_*`, vLLM/SGLang offload segments, psm_*) all count:
the seeds' goal is "zero shared-memory/offload files", so an unknown name is
residue until an operator excludes it.

Holders come from /proc/<pid>/maps (mapped) and /proc/<pid>/fd (open). Processes
come and go during a scan: a vanished process is skipped; a process whose maps or
fds we may not read (not root) is counted in `unreadable_pids`, and deletion
refuses to act while any is unreadable, since nobody could prove the file unused.

Warning: a process in another mount namespace reports paths of its own view; a
container sharing the host's /dev/shm (`ipc_mode = "host"`) reports the same paths.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from anvil_ctl.core.model import ResidueFile, ResidueRemoval

# We scan /dev/shm, never create files in it.
DEFAULT_DIRECTORY = Path("/dev/shm")  # noqa: S108
DEFAULT_INCLUDE: tuple[str, ...] = ("*",)
DEFAULT_EXCLUDE: tuple[str, ...] = ("sem.*", "pulse-shm-*")
DELETED_SUFFIX = " (deleted)"

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Seen:
    """One file as observed: its inode identity and content stamp, and who holds it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    pids: tuple[int, ...]


@dataclass(frozen=True)
class Observation:
    """One scan: residue files by path and how many processes could not be inspected."""

    files: dict[str, _Seen] = field(default_factory=dict)
    unreadable_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class RemovalReport:
    """What a removal removed, and every residue file it kept with the reason."""

    removed: tuple[str, ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    unreadable_pids: tuple[int, ...] = ()


class ShmScanner:
    """Residue files in a shared-memory directory and their holders (a SharedMemory port)."""

    def __init__(
        self,
        directory: Path = DEFAULT_DIRECTORY,
        *,
        include: Iterable[str] = DEFAULT_INCLUDE,
        exclude: Iterable[str] = DEFAULT_EXCLUDE,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.directory = Path(os.path.realpath(directory))
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.proc_root = proc_root

    def remove_unheld(self) -> ResidueRemoval:
        report = remove_residue(self)
        return ResidueRemoval(removed=report.removed, kept=report.kept)

    def residue(self) -> list[ResidueFile]:
        obs = self.observe()
        return [ResidueFile(p, s.size, s.pids) for p, s in sorted(obs.files.items())]

    def observe(self) -> Observation:
        found = self._files()
        holders, unreadable = self._holders(set(found))
        files = {
            path: _Seen(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, holders.get(path, ()))
            for path, st in found.items()
        }
        return Observation(files=files, unreadable_pids=unreadable)

    def _matches(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(name, g) for g in self.exclude):
            return False
        return any(fnmatch.fnmatchcase(rel, g) for g in self.include)

    def _files(self) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        # A file may vanish between listing and lstat: that is an engine cleaning up.
        for root, dirs, names in os.walk(self.directory):
            dirs.sort()
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.directory)
                if not self._matches(rel):
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[path] = st
        return out

    def _holders(self, paths: set[str]) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
        """path -> pids mapping or holding it open; and pids that could not be read."""
        holders: dict[str, set[int]] = {}
        unreadable: set[int] = set()
        if not paths:
            return {}, ()
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return {}, ()
        for entry in entries:
            if not entry.isdigit():
                continue
            pid = int(entry)
            for path in self._paths_of(pid, unreadable):
                if path in paths:
                    holders.setdefault(path, set()).add(pid)
        return {p: tuple(sorted(s)) for p, s in holders.items()}, tuple(sorted(unreadable))

    def _paths_of(self, pid: int, unreadable: set[int]) -> set[str]:
        found: set[str] = set()
        base = self.proc_root / str(pid)
        try:
            with open(base / "maps", encoding="utf-8", errors="surrogateescape") as fh:
                for line in fh:
                    parts = line.rstrip("\n").split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        found.add(parts[5].removesuffix(DELETED_SUFFIX))
        except (FileNotFoundError, ProcessLookupError):
            return found  # the process exited during the scan
        except OSError:
            unreadable.add(pid)  # permission denied (not root) or a kernel refusal
        try:
            fds = os.listdir(base / "fd")
        except (FileNotFoundError, ProcessLookupError):
            return found
        except OSError:
            unreadable.add(pid)
            return found
        for fd in fds:
            try:
                found.add(os.readlink(base / "fd" / fd).removesuffix(DELETED_SUFFIX))
            except OSError:
                continue  # fd closed between listdir and readlink
        return found


def remove_residue(
    scanner: ShmScanner,
    *,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    allow_unreadable: bool = False,
) -> RemovalReport:
    """Delete residue only when two observations `interval_s` apart agree and nobody holds it.

    Agree means: the same inode, size and mtime both times, and no process mapped
    or held it open either time. Any unreadable process makes the scan unproven,
    and then nothing is removed, unless the caller passes `allow_unreadable`
    (some sandboxes deny even root the maps of PID 1; the report still names them).
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


def _unlink_if_unchanged(path: str, seen: _Seen) -> str | None:
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
