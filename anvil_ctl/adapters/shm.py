"""Shared-memory residue: files our engines left in /dev/shm, and removal only when verified twice.

/dev/shm is shared with every other program; none of theirs is ever residue:

    ours = not excluded
           and held by no process outside managed containers, right now
           and ( held now by a process of a managed container      -> marked in the ledger
                 or marked in the ledger earlier (same path, device and inode, this boot)
                 or its name matches an include glob )
    residue = ours and held by no process at all

Holders come from /proc/<pid>/maps and fd, matched by device and inode, and belong to a
managed container by cgroup (`proc_cgroup_container`, which also maps NVML's PIDs to containers
on real GPUs) or by ancestry. An unreadable process makes deletion refuse.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anvil_ctl.config.host import ENGINE_SEGMENTS
from anvil_ctl.core.model import LABEL_MANAGED, ResidueFile, ResidueRemoval, ShmMark
from anvil_ctl.core.ports import ContainerRuntime, ShmLedger
from anvil_ctl.log import get_logger

# We scan /dev/shm, never create files in it.
DEFAULT_DIRECTORY = Path("/dev/shm")  # noqa: S108
DELETED_SUFFIX = " (deleted)"
MAX_ANCESTRY = 64
"""How far up the parent chain a holder is followed to a managed container's init."""

_CONTAINER_ID = re.compile(r"(?:docker[-/]|/)([0-9a-f]{64})(?:\.scope)?\b")

ManagedContainers = Callable[[], Mapping[str, int | None]]
"""Managed containers now: container ID -> init PID (None when it runs no process)."""

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


def proc_cgroup_container(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The Docker container ID a host PID runs in, from /proc/PID/cgroup (None if none)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    found = _CONTAINER_ID.findall(text)
    return found[-1] if found else None


def managed_containers(runtime: ContainerRuntime) -> ManagedContainers:
    """The runtime's containers labelled io.anvil.managed=true, with their init PIDs."""

    def listed() -> dict[str, int | None]:
        return {c.id: c.pid for c in runtime.list(labels={LABEL_MANAGED: "true"})}

    return listed


class ShmScanner:
    """Our residue in a shared-memory directory and its holders, with what the ledger remembers."""

    def __init__(
        self,
        directory: Path = DEFAULT_DIRECTORY,
        *,
        include: Iterable[str] = ENGINE_SEGMENTS,
        exclude: Iterable[str] = (),
        proc_root: Path = Path("/proc"),
        managed: ManagedContainers | None = None,
        ledger: ShmLedger | None = None,
    ) -> None:
        self.directory = Path(os.path.realpath(directory))
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.proc_root = proc_root
        self.managed = managed
        self.ledger = ledger

    def remove_unheld(self) -> ResidueRemoval:
        return remove_residue(self)

    def residue(self) -> list[ResidueFile]:
        obs = self.observe()
        return [ResidueFile(p, s.size) for p, s in sorted(obs.files.items()) if not s.pids]

    def observe(self) -> Observation:
        """Our files now; marks in the ledger what managed containers hold.

        A file neither named nor marked is ours only if a managed container's process holds it,
        so for those only the managed containers' processes are read before the whole table."""
        found = self._files()
        boot_id = self._boot_id()
        remembered = self.ledger.marks(boot_id) if found and self.ledger is not None else []
        known = {(m.path, m.dev, m.ino) for m in remembered}
        maybe = {p: st for p, st in found.items() if (p, st.st_dev, st.st_ino) in known or self._named(p)}
        others = {p: st for p, st in found.items() if p not in maybe}
        first: tuple[int, ...] = ()
        if others and self.managed is not None:
            held, first = self._holders(others, pids=self._managed_pids())
            maybe |= {p: others[p] for p in held}
        holders, unreadable = self._holders(maybe)
        unreadable = tuple(sorted({*first, *unreadable}))
        # pid -> the managed container it runs in (the runtime is asked only if some file is held)
        owner = self._owner_in(dict(self.managed())) if holders and self.managed is not None else None
        files: dict[str, SeenFile] = {}
        marks: list[ShmMark] = []
        for path, st in maybe.items():
            pids = holders.get(path, ())
            owners = {pid: owner(pid) if owner else None for pid in pids}
            if any(cid is None for cid in owners.values()):
                continue  # another program holds it: never ours, whoever else does
            ident = (path, st.st_dev, st.st_ino)
            if owners:
                cids = sorted({cid for cid in owners.values() if cid is not None})
                marks += [ShmMark(*ident, container_id=cid, boot_id=boot_id) for cid in cids]
            elif ident not in known and not self._named(path):
                continue  # nobody of ours was ever seen with it and no engine names it so
            files[path] = SeenFile(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, pids)
        if marks and self.ledger is not None:
            self.ledger.remember(marks)
        return Observation(files=files, unreadable_pids=unreadable)

    def _named(self, path: str, globs: tuple[str, ...] | None = None) -> bool:
        """Whether a glob of `globs` (the include globs unless given) names the file."""
        rel = os.path.relpath(path, self.directory)
        name = rel.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(name, g) for g in globs or self.include)

    def _files(self) -> dict[str, os.stat_result]:
        """Every regular file under the directory that no exclude glob names."""
        out: dict[str, os.stat_result] = {}
        for root, dirs, names in os.walk(self.directory):
            dirs.sort()
            for name in names:
                path = os.path.join(root, name)
                if self.exclude and self._named(path, self.exclude):
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue  # vanished since the listing: an engine cleaning up
                if stat.S_ISREG(st.st_mode):
                    out[path] = st
        return out

    def _boot_id(self) -> str:
        try:
            return (self.proc_root / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return ""

    def _managed_pids(self) -> list[int]:
        """The processes that run in a managed container now."""
        assert self.managed is not None
        containers = dict(self.managed())
        owner = self._owner_in(containers)
        return [pid for pid in self._pids() if owner(pid)] if containers else []

    def _pids(self) -> list[int]:
        """Every process on the host now (none where /proc cannot be listed)."""
        try:
            return [int(e) for e in os.listdir(self.proc_root) if e.isdigit()]
        except OSError:
            return []

    def _owner_in(self, containers: Mapping[str, int | None]) -> Callable[[int], str | None]:
        """pid -> the one of `containers` it runs in, or None: by its cgroup, else (a cgroup
        namespace, an unusual driver) by descent from a container's init; answers remembered."""
        inits = {pid: cid for cid, pid in containers.items() if pid}
        below: dict[int, str | None] = {}  # each process's stat is read once for the whole table

        @functools.cache
        def owner(pid: int) -> str | None:
            cid = proc_cgroup_container(pid, self.proc_root)
            if cid is not None:
                return cid if cid in containers else None  # another container is another program
            return self._init_above(pid, inits, below)

        return owner

    def _init_above(self, pid: int, inits: dict[int, str], below: dict[int, str | None]) -> str | None:
        """The managed container whose init `pid` descends from, remembered in `below` for every
        process on the way up."""
        chain: list[int] = []
        found: str | None = None
        for _ in range(MAX_ANCESTRY):
            if pid in below:
                found = below[pid]
                break
            chain.append(pid)
            if pid in inits:
                found = inits[pid]
                break
            parent = _parent(self.proc_root, pid)
            if parent is None or parent <= 1 or parent == pid:
                break
            pid = parent
        else:
            return None  # too deep to tell: not remembered
        below.update(dict.fromkeys(chain, found))
        return found

    def _holders(
        self, found: dict[str, os.stat_result], *, pids: Iterable[int] | None = None
    ) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
        """path -> pids mapping or holding it open (of `pids`, else of every process); and
        pids that could not be read."""
        if not found:
            return {}, ()
        by_inode = {(st.st_dev, st.st_ino): path for path, st in found.items()}
        by_path = {path: st.st_ino for path, st in found.items()}
        names = {os.path.basename(p) for p in found}
        inodes = sorted({st.st_ino for st in found.values()})
        lines = _lines_mapping(inodes)
        # A line mapping a candidate carries its inode as a field of its own.
        tokens = tuple(t for i in inodes for t in (f" {i} ".encode(), f" {i}\n".encode()))
        holders: dict[str, set[int]] = {}
        unreadable: set[int] = set()

        def held_by(pid: int) -> set[str]:
            found: set[str] = set()
            # This runs for every process on the host: only the maps lines whose inode field is a
            # candidate's (`lines`, one pass in C) are decoded and parsed.
            base = f"{self.proc_root}/{pid}"
            try:
                with open(f"{base}/maps", "rb") as fh:
                    raw = fh.read()
                candidates: Iterable[bytes] = ()
                if any(token in raw for token in tokens):  # most processes map none: memmem only
                    candidates = (m[0] for m in lines.finditer(raw))
                for line in candidates:
                    hit = _mapped(line.decode("utf-8", errors="surrogateescape"), by_inode, by_path)
                    if hit is not None:
                        found.add(hit)
            except (FileNotFoundError, ProcessLookupError):
                return found  # the process exited during the scan
            except OSError:
                unreadable.add(pid)  # permission denied (not root) or a kernel refusal
            try:
                fds = os.listdir(f"{base}/fd")
            except (FileNotFoundError, ProcessLookupError):
                return found
            except OSError:
                unreadable.add(pid)
                return found
            for fd in fds:
                link = f"{base}/fd/{fd}"
                try:
                    target = os.readlink(link).removesuffix(DELETED_SUFFIX)
                    # Only a candidate's name is worth a stat (which follows the link into
                    # whatever file system the descriptor is on).
                    if os.path.basename(target) not in names:
                        continue
                    st = os.stat(link)
                except OSError:
                    continue  # fd closed between listdir and readlink/stat
                hit = by_inode.get((st.st_dev, st.st_ino))
                if hit is not None:
                    found.add(hit)
            return found

        for pid in self._pids() if pids is None else pids:
            for path in held_by(pid):
                holders.setdefault(path, set()).add(pid)
        return {p: tuple(sorted(s)) for p, s in holders.items()}, tuple(sorted(unreadable))


def _lines_mapping(inodes: Iterable[int]) -> re.Pattern[bytes]:
    """The /proc/<pid>/maps lines whose inode (the fifth field) is one of `inodes`."""
    alternatives = b"|".join(str(i).encode() for i in sorted(set(inodes)))
    return re.compile(
        rb"^[^ \n]+ [^ \n]+ [^ \n]+ [^ \n]+ (?:" + alternatives + rb")(?=[ \n]|\Z)[^\n]*\n?", re.M
    )


def _mapped(line: str, by_inode: dict[tuple[int, int], str], by_path: dict[str, int]) -> str | None:
    """The candidate a /proc/<pid>/maps line maps, if any: `addr perms offset MAJ:MIN inode path`."""
    parts = line.rstrip("\n").split(maxsplit=5)
    if len(parts) < 5 or parts[4] == "0":
        return None  # anonymous memory
    try:
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        ino = int(parts[4])
    except ValueError:
        return None
    hit = by_inode.get((os.makedev(major, minor), ino))
    if hit is None and len(parts) == 6:
        # Overlay and some stacked file systems report the underlying device in maps,
        # not the one stat() shows; the same path with the same inode is the same file.
        path = parts[5].removesuffix(DELETED_SUFFIX)
        if by_path.get(path) == ino:
            hit = path
    return hit


def _parent(proc_root: Path, pid: int) -> int | None:
    """The parent PID from /proc/<pid>/stat (None if the process is gone)."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def remove_residue(
    scanner: ShmScanner,
    *,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    allow_unreadable: bool = False,
) -> ResidueRemoval:
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
    return ResidueRemoval(removed=tuple(removed), kept=tuple(kept))


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
        if SeenFile(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, seen.pids) != seen:
            return "changed before removal"
        os.unlink(path)
    except FileNotFoundError:
        return "vanished before removal"
    except OSError as exc:
        return f"cannot remove: {exc.strerror}"
    return None
