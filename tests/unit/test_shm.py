"""Shared-memory residue means ours: which files, who holds them, and removal only when verified twice.

A temporary directory stands in for /dev/shm. `FakeProc` builds a /proc of
fake processes (cgroup, stat, open descriptors, mappings) around real files, so
the scanner's holder lookup runs unchanged; a few tests use the real /proc with
real holder processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anvil_ctl.adapters.shm import (
    ManagedContainers,
    ShmScanner,
    _lines_mapping,
    managed_containers,
    proc_cgroup_container,
    remove_residue,
)
from anvil_ctl.config.host import ENGINE_SEGMENTS, HostConfig
from anvil_ctl.core.model import LABEL_MANAGED, ContainerSpec, ShmMark
from anvil_ctl.core.ports import SharedMemory, ShmLedger
from anvil_ctl.testing.runtime import FakeRuntime
from tests.unit.fakehost import ScriptedWorld

ENGINE = "e" * 64  # a managed container
OTHER = "0" * 64  # a container anvilctl does not manage
BOOT = "boot-1"

HOLD_OPEN = """
import sys
fh = open(sys.argv[1], "rb")
print("ready", flush=True)
sys.stdin.read()
"""

# Python's mmap module keeps a duplicate descriptor; libc's mmap does not.
HOLD_MAPPED = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)
print("ready", flush=True)  # the descriptor is closed; only the mapping remains
sys.stdin.read()
"""


class FakeProc:
    """A /proc tree of fake processes around real files: cgroup, stat, fd links and maps."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "sys/kernel/random").mkdir(parents=True)
        self.boot(BOOT)

    def boot(self, boot_id: str) -> None:
        (self.root / "sys/kernel/random/boot_id").write_text(boot_id + "\n")

    def process(
        self,
        pid: int,
        *,
        container: str | None = None,
        ppid: int = 1,
        opens: tuple[Path, ...] = (),
        maps: tuple[Path, ...] = (),
    ) -> None:
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True)
        where = f"/system.slice/docker-{container}.scope" if container else "/system.slice/app.service"
        (base / "cgroup").write_text(f"0::{where}\n")
        (base / "stat").write_text(f"{pid} (some (odd) name) S {ppid} {pid} {pid} 0 -1\n")
        for n, path in enumerate(opens, start=3):
            (base / "fd" / str(n)).symlink_to(path)
        lines = ["00400000-00452000 r-xp 00000000 00:00 0 \n"]
        for path in maps:
            st = os.stat(path)
            dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
            lines.append(f"7f0000000000-7f0000001000 rw-s 00000000 {dev} {st.st_ino}    {path}\n")
        (base / "maps").write_text("".join(lines))

    def exit(self, pid: int) -> None:
        base = self.root / str(pid)
        for fd in (base / "fd").iterdir():
            fd.unlink()
        for f in ("cgroup", "stat", "maps"):
            (base / f).unlink()
        (base / "fd").rmdir()
        base.rmdir()


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d.resolve()  # the scanner reports real paths, as /proc does


class MemoryShmLedger:
    """ShmLedger in memory: what a scanner marked, for tests of the residue rule."""

    def __init__(self, marks: list[ShmMark] | None = None) -> None:
        self.recorded: list[ShmMark] = list(marks or [])

    def marks(self, boot_id: str) -> list[ShmMark]:
        return [m for m in self.recorded if m.boot_id == boot_id]

    def remember(self, marks: list[ShmMark]) -> None:
        """Like the store: one mark per (boot, path, device, inode), the first holder's."""
        known = {(m.boot_id, m.path, m.dev, m.ino) for m in self.recorded}
        for m in marks:
            if (m.boot_id, m.path, m.dev, m.ino) not in known:
                known.add((m.boot_id, m.path, m.dev, m.ino))
                self.recorded.append(m)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def ledger() -> MemoryShmLedger:
    return MemoryShmLedger()


def managed(*containers: str, inits: dict[str, int] | None = None) -> ManagedContainers:
    """The managed containers the runtime would list, with their init PIDs."""
    return lambda: {cid: (inits or {}).get(cid) for cid in containers}


@pytest.fixture
def scanner(shm: Path, proc: FakeProc, ledger: MemoryShmLedger) -> Callable[..., ShmScanner]:
    """A scanner of `shm` over the fake /proc; ENGINE is managed unless told otherwise."""

    def make(**kw: object) -> ShmScanner:
        args: dict[str, object] = {"proc_root": proc.root, "managed": managed(ENGINE), "ledger": ledger}
        args.update(kw)
        return ShmScanner(shm, **args)  # type: ignore[arg-type]

    return make


def names(scanner: ShmScanner) -> list[str]:
    return [Path(r.path).relative_to(scanner.directory).as_posix() for r in scanner.residue()]


def file(path: Path, size: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


@pytest.fixture
def holder() -> Iterator[Callable[[str, Path], subprocess.Popen[str]]]:
    """Start a real process holding a file (open or mapped); stopped by PID at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(script: str, path: Path) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()


def as_managed_init(pid: int) -> ManagedContainers:
    """Real /proc: pretend this test process is the init of a managed container.

    Its children are then in that container: through their cgroup when it names a
    container (this test may itself run in one), else through their parent chain.
    """
    cid = proc_cgroup_container(pid) or ENGINE
    return managed(cid, inits={cid: os.getpid()})


class TestResidueIsOurs:
    def test_is_a_shared_memory_port_and_the_memory_ledger_a_ledger(self, shm: Path) -> None:
        assert isinstance(ShmScanner(shm), SharedMemory)
        assert isinstance(MemoryShmLedger(), ShmLedger)

    def test_an_empty_directory_has_no_residue(self, scanner: Callable[..., ShmScanner]) -> None:
        assert scanner().residue() == []

    def test_a_foreign_file_is_not_residue(self, shm: Path, scanner: Callable[..., ShmScanner]) -> None:
        file(shm / "foreign-app.dat")
        file(shm / "offload" / "kv-0001.bin", 7)
        assert names(scanner()) == []

    def test_a_postgresql_segment_held_by_a_process_outside_containers_is_not_residue(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        seg = file(shm / "PostgreSQL.1234", 1 << 20)
        proc.process(4321, opens=(seg,), maps=(seg,))
        assert names(scanner()) == []
        assert ledger.recorded == []
        proc.exit(4321)  # even once the server stopped: nobody of ours ever held it
        assert names(scanner()) == []

    def test_an_engine_named_file_nobody_holds_is_residue(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        for name in ("nccl-AbC123", "torch_4242_1234_0", "psm_0a1b2c3d", "sglang_host_pool_ff.mmap"):
            file(shm / name)
        assert names(scanner()) == [
            "nccl-AbC123",
            "psm_0a1b2c3d",
            "sglang_host_pool_ff.mmap",
            "torch_4242_1234_0",
        ]

    def test_the_systems_own_files_are_not_residue_by_default(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        for name in ("sem.mp-1a2b", "pulse-shm-1234", "PostgreSQL.99", "lttng-ust-wait-8"):
            file(shm / name)
        assert names(scanner()) == []

    def test_an_engine_named_file_held_by_another_program_is_not_ours(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        """A training job on the host uses NCCL too: its live segments are its own."""
        seg = file(shm / "nccl-job001")
        proc.process(900, opens=(seg,))
        obs = scanner().observe()
        assert obs.files == {}

    def test_a_process_of_an_unmanaged_container_is_another_program(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        seg = file(shm / "kv-of-someone-else")
        proc.process(910, container=OTHER, opens=(seg,))
        assert scanner().observe().files == {}
        assert ledger.recorded == []

    def test_a_file_a_managed_container_held_while_running_is_residue_after_it_stopped(
        self,
        shm: Path,
        proc: FakeProc,
        scanner: Callable[..., ShmScanner],
        ledger: MemoryShmLedger,
    ) -> None:
        kv = file(shm / "offload" / "kv-0001.bin")
        proc.process(700, container=ENGINE, maps=(kv,))
        proc.process(701, container=ENGINE, opens=(kv,))
        running = scanner()
        assert names(running) == []  # in use by the engine: not residue (yet)
        assert running.observe().files[str(kv)].pids == (700, 701)
        st = kv.stat()
        assert ledger.recorded == [ShmMark(str(kv), st.st_dev, st.st_ino, ENGINE, BOOT)]
        proc.exit(700)
        proc.exit(701)  # the container stopped and left the file
        assert names(scanner(managed=managed())) == ["offload/kv-0001.bin"]

    def test_a_worker_is_found_through_the_containers_init_when_its_cgroup_names_no_container(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        kv = file(shm / "engine-buffer")
        proc.process(800, ppid=1)  # the container's init (cgroup namespace: no ID in the path)
        proc.process(801, ppid=800)
        proc.process(802, ppid=801, opens=(kv,))
        obs = scanner(managed=managed(ENGINE, inits={ENGINE: 800})).observe()
        assert obs.files[str(kv)].pids == (802,)
        assert [m.container_id for m in ledger.recorded] == [ENGINE]

    def test_a_file_held_by_a_managed_and_a_foreign_process_is_not_ours(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        seg = file(shm / "shared-with-host")
        proc.process(700, container=ENGINE, opens=(seg,))
        proc.process(4321, opens=(seg,))
        assert scanner().observe().files == {}
        assert ledger.recorded == []  # while another program holds it, it is not marked ours
        proc.exit(4321)
        assert names(scanner()) == []  # in use by the engine
        proc.exit(700)
        assert names(scanner()) == ["shared-with-host"]  # seen held by the engine alone

    def test_a_new_file_at_a_marked_path_is_not_ours(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        kv = file(shm / "engine-buffer")
        proc.process(700, container=ENGINE, opens=(kv,))
        assert scanner().observe().files
        proc.exit(700)
        kv.rename(shm.parent / "old-buffer")  # still allocated: the new file gets a new inode
        file(shm / "engine-buffer")  # another program's file under the same name
        assert names(scanner()) == []

    def test_a_mark_of_another_boot_does_not_count(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        kv = file(shm / "engine-buffer")
        proc.process(700, container=ENGINE, opens=(kv,))
        scanner().observe()
        proc.exit(700)
        proc.boot("boot-2")  # a reboot empties a tmpfs: no mark of boot-1 names a file now
        assert names(scanner()) == []

    def test_exclude_globs_win_over_names_marks_and_holders(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        file(shm / "nccl-keep")
        file(shm / "nccl-1")
        held = file(shm / "cache" / "engine-owned")
        proc.process(700, container=ENGINE, opens=(held,))
        scan = scanner(exclude=["*-keep", "cache/*"])
        assert scan.observe().files.keys() == {str(shm / "nccl-1")}
        assert ledger.recorded == []
        proc.exit(700)
        assert names(scan) == ["nccl-1"]

    def test_include_globs_are_configurable(self, shm: Path, scanner: Callable[..., ShmScanner]) -> None:
        file(shm / "nccl-1")
        file(shm / "torch_1")
        file(shm / "offload" / "vllm-kv-1")
        assert names(scanner(include=["nccl-*", "vllm-kv-*"])) == ["nccl-1", "offload/vllm-kv-1"]

    def test_a_container_with_a_private_shm_does_not_hold_the_hosts_file_of_the_same_name(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        """Its /dev/shm/x is another file: another device and inode, whatever the path says."""
        host_file = file(shm / "engine-buffer")
        own = file(shm.parent / "container-shm" / "engine-buffer")
        proc.process(700, container=ENGINE, maps=(own,))
        maps = (proc.root / "700" / "maps").read_text().replace(str(own), str(host_file))
        (proc.root / "700" / "maps").write_text(maps)
        assert scanner().observe().files == {}
        assert ledger.recorded == []

    def test_the_runtime_is_asked_only_when_a_file_is_held(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        calls: list[int] = []

        def counted() -> dict[str, int | None]:
            calls.append(1)
            return {ENGINE: None}

        file(shm / "nccl-1")
        scanner(managed=counted).residue()
        assert calls == []
        proc.process(700, container=ENGINE, opens=(shm / "nccl-1",))
        scanner(managed=counted).residue()
        assert calls == [1]

    def test_a_file_no_name_or_mark_makes_ours_is_looked_up_only_in_managed_containers(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner], ledger: MemoryShmLedger
    ) -> None:
        seg = file(shm / "PostgreSQL.1234", 1 << 20)
        proc.process(4321, maps=(seg,))  # the database server, outside containers
        (proc.root / "4400" / "maps").mkdir(parents=True)  # any other process: never read
        (proc.root / "4400" / "cgroup").write_text("0::/system.slice/app.service\n")
        obs = scanner().observe()
        assert (obs.files, obs.unreadable_pids) == ({}, ())
        # Held by a managed container's process, the same file is read everywhere: the
        # outsider's hold makes it not ours, and the process that cannot be read is named.
        proc.process(700, container=ENGINE, maps=(seg,))
        obs = scanner().observe()
        assert (obs.files, obs.unreadable_pids) == ({}, (4400,))
        assert ledger.recorded == []

    def test_symlinks_are_not_residue_and_not_followed(
        self, shm: Path, tmp_path: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        (shm / "nccl-link").symlink_to(file(tmp_path / "outside"))
        assert scanner().residue() == []

    def test_a_missing_proc_root_yields_no_holders(self, shm: Path, tmp_path: Path) -> None:
        file(shm / "nccl-1")
        (residue,) = ShmScanner(shm, proc_root=tmp_path / "noproc").residue()
        assert residue.pids == ()

    def test_an_unreadable_process_is_counted_not_fatal(self, shm: Path, tmp_path: Path) -> None:
        file(shm / "nccl-1")
        proc_root = tmp_path / "proc"
        (proc_root / "77" / "maps").mkdir(parents=True)  # reading a directory fails: not ENOENT
        (proc_root / "self").mkdir()
        obs = ShmScanner(shm, proc_root=proc_root).observe()
        assert obs.unreadable_pids == (77,)
        assert [s.pids for s in obs.files.values()] == [()]


class TestMapsLines:
    def test_only_lines_whose_inode_field_is_a_candidates_are_picked(self) -> None:
        maps = (
            b"7f00-7f01 rw-s 00000000 00:1a 1234                       /dev/shm/x\n"
            b"7f00-7f01 rw-s 00000000 00:1a 12345                      /dev/shm/y\n"
            b"7f00-7f01 rw-p 00000000 00:00 0 \n"
            b"7f00-7f01 r--p 00001234 fd:01 77 /usr/lib/x 1234\n"
            b"55aa-55ab rw-s 00000000 00:1a 99 /dev/shm/z (deleted)\n"
            b"7f00-7f01 rw-s 00000000 00:1a 1234"
        )
        picked = [m[0] for m in _lines_mapping([1234, 99]).finditer(maps)]
        assert picked == [
            b"7f00-7f01 rw-s 00000000 00:1a 1234                       /dev/shm/x\n",
            b"55aa-55ab rw-s 00000000 00:1a 99 /dev/shm/z (deleted)\n",
            b"7f00-7f01 rw-s 00000000 00:1a 1234",
        ]


class TestRealProc:
    def test_a_real_process_holding_a_file_open_is_found_and_marked(
        self,
        shm: Path,
        holder: Callable[[str, Path], subprocess.Popen[str]],
        ledger: MemoryShmLedger,
    ) -> None:
        path = file(shm / "engine-held")
        p = holder(HOLD_OPEN, path)
        obs = ShmScanner(shm, managed=as_managed_init(p.pid), ledger=ledger).observe()
        assert obs.files[str(path)].pids == (p.pid,)
        assert [m.path for m in ledger.recorded] == [str(path)]

    def test_a_real_process_mapping_a_file_without_a_descriptor_is_found(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        path = file(shm / "vllm_mapped")
        p = holder(HOLD_MAPPED, path)
        fds = [os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")]
        assert str(path) not in fds, "the fixture must hold a mapping only"
        obs = ShmScanner(shm, managed=as_managed_init(p.pid)).observe()
        assert obs.files[str(path)].pids == (p.pid,)

    def test_a_real_process_outside_managed_containers_makes_a_file_not_ours(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        seg = file(shm / "PostgreSQL.2718")
        named = file(shm / "psm_host_job")
        holder(HOLD_OPEN, seg)
        holder(HOLD_MAPPED, named)
        assert ShmScanner(shm, managed=managed(ENGINE)).observe().files == {}


class TestRemoveResidue:
    def test_removes_our_files_unchanged_and_unheld_in_both_observations(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        file(shm / "nccl-1")
        file(shm / "sem.system")
        file(shm / "PostgreSQL.1234")
        slept: list[float] = []
        report = remove_residue(scanner(), interval_s=0.5, sleep=slept.append)
        assert slept == [0.5]
        assert report.removed == (str(shm / "nccl-1"),)
        assert report.kept == ()  # files not ours are not even mentioned
        assert sorted(p.name for p in shm.iterdir()) == ["PostgreSQL.1234", "sem.system"]

    def test_keeps_what_a_managed_container_holds_and_never_touches_another_programs_files(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        live = file(shm / "nccl-live")
        left = file(shm / "nccl-left")
        pg = file(shm / "PostgreSQL.1234")
        job = file(shm / "torch_77_1_0")  # a host program's, named like an engine's
        proc.process(700, container=ENGINE, opens=(live,))
        proc.process(4321, opens=(pg,), maps=(job,))
        report = remove_residue(scanner(), interval_s=0, sleep=lambda _: None)
        assert report.removed == (str(left),)
        assert report.kept == ((str(live), "mapped or open by pids [700]"),)
        assert live.exists() and pg.exists() and job.exists() and not left.exists()

    def test_a_file_the_engine_held_is_removed_once_the_engine_is_gone(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        kv = file(shm / "offload" / "kv-0001.bin")
        proc.process(700, container=ENGINE, opens=(kv,))
        assert remove_residue(scanner(), interval_s=0, sleep=lambda _: None).removed == ()
        proc.exit(700)
        report = remove_residue(scanner(), interval_s=0, sleep=lambda _: None)
        assert report.removed == (str(kv),)

    def test_on_the_real_proc_keeps_held_files_and_removes_free_ones(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        held = file(shm / "psm_held")
        mapped = file(shm / "psm_mapped")
        free = file(shm / "nccl-free", 1)
        opener = holder(HOLD_OPEN, held)
        mapper = holder(HOLD_MAPPED, mapped)
        cid = proc_cgroup_container(opener.pid) or ENGINE
        scan = ShmScanner(shm, managed=managed(cid, inits={cid: os.getpid()}))
        # allow_unreadable: sandboxes may deny even root the maps of PID 1
        report = remove_residue(scan, interval_s=0, sleep=lambda _: None, allow_unreadable=True)
        assert report.removed == (str(free),)
        assert report.kept == (
            (str(held), f"mapped or open by pids [{opener.pid}]"),
            (str(mapped), f"mapped or open by pids [{mapper.pid}]"),
        )
        assert held.exists() and mapped.exists() and not free.exists()

    def test_keeps_a_file_that_changed_between_observations(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        growing = file(shm / "torch_growing", 1)

        def write_more(_: float) -> None:
            growing.write_bytes(b"12")

        report = remove_residue(scanner(), sleep=write_more)
        assert report.kept == ((str(growing), "changed between observations"),)
        assert growing.read_bytes() == b"12"

    def test_keeps_a_file_that_appeared_between_observations(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        new = shm / "nccl-new"
        report = remove_residue(scanner(), sleep=lambda _: file(new))
        assert report.kept == ((str(new), "appeared between observations"),)
        assert new.exists()

    def test_keeps_a_file_another_program_took_hold_of_between_observations(
        self, shm: Path, proc: FakeProc, scanner: Callable[..., ShmScanner]
    ) -> None:
        seg = file(shm / "nccl-taken")
        report = remove_residue(scanner(), sleep=lambda _: proc.process(4321, opens=(seg,)))
        assert report.kept == ((str(seg), "vanished between observations"),)
        assert seg.exists()

    def test_reports_a_file_that_vanished_between_observations(
        self, shm: Path, scanner: Callable[..., ShmScanner]
    ) -> None:
        gone = file(shm / "nccl-gone")
        report = remove_residue(scanner(), sleep=lambda _: gone.unlink())
        assert report.kept == ((str(gone), "vanished between observations"),)
        assert report.removed == ()

    def test_removes_nothing_while_any_process_could_not_be_inspected(
        self, shm: Path, tmp_path: Path
    ) -> None:
        file(shm / "nccl-1")
        proc_root = tmp_path / "proc"
        (proc_root / "77" / "maps").mkdir(parents=True)
        report = remove_residue(ShmScanner(shm, proc_root=proc_root), interval_s=0, sleep=lambda _: None)
        assert report.removed == ()
        assert report.kept == ((str(shm / "nccl-1"), "holders unknown: 1 processes could not be inspected"),)
        assert (shm / "nccl-1").exists()


class TestResidueConfig:
    def test_defaults_are_the_engines_known_names_and_no_exclusions(self) -> None:
        rc = HostConfig().residue
        assert rc.directory == Path("/dev/shm")
        assert rc.include == ENGINE_SEGMENTS == ("nccl-*", "torch_*", "psm_*", "sglang_*")
        assert rc.exclude == ()

    def test_the_section_is_read_from_the_host_config(self) -> None:
        cfg = HostConfig.model_validate(
            {"residue": {"include": ["nccl-*", "vllm-offload-*"], "exclude": ["nccl-keep*"]}}
        )
        assert cfg.residue.include == ("nccl-*", "vllm-offload-*")
        assert cfg.residue.exclude == ("nccl-keep*",)

    def test_an_unknown_key_is_refused(self) -> None:
        with pytest.raises(ValueError, match="excludes"):
            HostConfig.model_validate({"residue": {"excludes": ["x"]}})

    def test_every_field_has_a_description(self) -> None:
        from anvil_ctl.config.host import ResidueConfig

        assert all(f.description for f in ResidueConfig.model_fields.values())


class TestManagedContainers:
    def test_lists_only_containers_labelled_managed_with_their_init_pids(self, tmp_path: Path) -> None:
        world = ScriptedWorld(tmp_path / "world.json")
        image = world.add_image("stub:1")
        rt = FakeRuntime(world)
        ours = rt.create(ContainerSpec(name="ours", image=image, labels=((LABEL_MANAGED, "true"),)))
        rt.create(ContainerSpec(name="theirs", image=image))
        assert list(managed_containers(rt)()) == [ours]
