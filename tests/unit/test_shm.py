"""Shared-memory residue: which files, who holds them, and removal only when verified twice."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anvil_ctl.adapters.shm import ShmScanner, remove_residue
from anvil_ctl.core.ports import SharedMemory

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


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d.resolve()  # the scanner reports real paths, as /proc does


@pytest.fixture
def holder() -> Iterator[Callable[[str, Path], subprocess.Popen[str]]]:
    """Start a process holding a file (open or mapped); stopped by PID at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(script: str, path: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


class TestShmScanner:
    def test_is_a_shared_memory_port(self, shm: Path) -> None:
        assert isinstance(ShmScanner(shm), SharedMemory)

    def test_an_empty_directory_has_no_residue(self, shm: Path) -> None:
        assert ShmScanner(shm).residue() == []

    def test_reports_engine_files_but_not_the_systems_own_by_default(self, shm: Path) -> None:
        (shm / "nccl-abc123").write_bytes(b"x" * 10)
        (shm / "torch_4242_0").write_bytes(b"y" * 3)
        (shm / "sem.mp-lock").write_bytes(b"s")
        (shm / "pulse-shm-1234").write_bytes(b"p")
        (shm / "offload").mkdir()
        (shm / "offload" / "kv-0001.bin").write_bytes(b"z" * 7)
        residue = ShmScanner(shm).residue()
        assert [(Path(r.path).relative_to(shm).as_posix(), r.size, r.pids) for r in residue] == [
            ("nccl-abc123", 10, ()),
            ("offload/kv-0001.bin", 7, ()),
            ("torch_4242_0", 3, ()),
        ]

    def test_include_and_exclude_globs_are_configurable(self, shm: Path) -> None:
        (shm / "nccl-1").write_bytes(b"1")
        (shm / "torch_1").write_bytes(b"1")
        (shm / "nccl-keep").write_bytes(b"1")
        scanner = ShmScanner(shm, include=["nccl-*"], exclude=["*-keep"])
        assert [Path(r.path).name for r in scanner.residue()] == ["nccl-1"]

    def test_symlinks_are_not_residue_and_not_followed(self, shm: Path, tmp_path: Path) -> None:
        outside = tmp_path / "outside"
        outside.write_bytes(b"o")
        (shm / "link").symlink_to(outside)
        assert ShmScanner(shm).residue() == []

    def test_names_the_process_holding_a_file_open(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        path = shm / "psm_held"
        path.write_bytes(b"h" * 4096)
        proc = holder(HOLD_OPEN, path)
        (residue,) = ShmScanner(shm).residue()
        assert residue.pids == (proc.pid,)

    def test_names_the_process_mapping_a_file_without_an_open_descriptor(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        path = shm / "vllm_mapped"
        path.write_bytes(b"m" * 4096)
        proc = holder(HOLD_MAPPED, path)
        fds = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert str(path) not in fds, "the fixture must hold a mapping only"
        (residue,) = ShmScanner(shm).residue()
        assert residue.pids == (proc.pid,)

    def test_a_missing_proc_root_yields_no_holders(self, shm: Path, tmp_path: Path) -> None:
        (shm / "f").write_bytes(b"1")
        (residue,) = ShmScanner(shm, proc_root=tmp_path / "noproc").residue()
        assert residue.pids == ()

    def test_an_unreadable_process_is_counted_not_fatal(self, shm: Path, tmp_path: Path) -> None:
        (shm / "f").write_bytes(b"1")
        proc_root = tmp_path / "proc"
        (proc_root / "77" / "maps").mkdir(parents=True)  # reading a directory fails: not ENOENT
        (proc_root / "self").mkdir()
        obs = ShmScanner(shm, proc_root=proc_root).observe()
        assert obs.unreadable_pids == (77,)
        assert [s.pids for s in obs.files.values()] == [()]


class TestRemoveResidue:
    def test_removes_files_unchanged_and_unheld_in_both_observations(self, shm: Path, tmp_path: Path) -> None:
        (shm / "nccl-1").write_bytes(b"1")
        (shm / "sem.system").write_bytes(b"s")
        slept: list[float] = []
        empty_proc = tmp_path / "proc"
        empty_proc.mkdir()
        scanner = ShmScanner(shm, proc_root=empty_proc)
        report = remove_residue(scanner, interval_s=0.5, sleep=slept.append)
        assert slept == [0.5]
        assert report.removed == (str(shm / "nccl-1"),)
        assert report.kept == ()
        assert sorted(p.name for p in shm.iterdir()) == ["sem.system"]

    def test_on_the_real_proc_keeps_held_files_and_removes_free_ones(
        self, shm: Path, holder: Callable[[str, Path], subprocess.Popen[str]]
    ) -> None:
        held = shm / "psm_held"
        held.write_bytes(b"h" * 4096)
        mapped = shm / "vllm_mapped"
        mapped.write_bytes(b"m" * 4096)
        free = shm / "nccl-free"
        free.write_bytes(b"f")
        opener = holder(HOLD_OPEN, held)
        mapper = holder(HOLD_MAPPED, mapped)
        # allow_unreadable: sandboxes may deny even root the maps of PID 1
        report = remove_residue(ShmScanner(shm), interval_s=0, sleep=lambda _: None, allow_unreadable=True)
        assert report.removed == (str(free),)
        assert report.kept == (
            (str(held), f"mapped or open by pids [{opener.pid}]"),
            (str(mapped), f"mapped or open by pids [{mapper.pid}]"),
        )
        assert held.exists() and mapped.exists() and not free.exists()

    def test_keeps_a_file_that_changed_between_observations(self, shm: Path) -> None:
        growing = shm / "torch_growing"
        growing.write_bytes(b"1")

        def write_more(_: float) -> None:
            growing.write_bytes(b"12")

        report = remove_residue(ShmScanner(shm), sleep=write_more, allow_unreadable=True)
        assert report.kept == ((str(growing), "changed between observations"),)
        assert growing.read_bytes() == b"12"

    def test_keeps_a_file_that_appeared_between_observations(self, shm: Path) -> None:
        new = shm / "nccl-new"
        report = remove_residue(ShmScanner(shm), sleep=lambda _: new.write_bytes(b"n"), allow_unreadable=True)
        assert report.kept == ((str(new), "appeared between observations"),)
        assert new.exists()

    def test_reports_a_file_that_vanished_between_observations(self, shm: Path) -> None:
        gone = shm / "nccl-gone"
        gone.write_bytes(b"g")
        report = remove_residue(ShmScanner(shm), sleep=lambda _: gone.unlink(), allow_unreadable=True)
        assert report.kept == ((str(gone), "vanished between observations"),)
        assert report.removed == ()

    def test_removes_nothing_while_any_process_could_not_be_inspected(
        self, shm: Path, tmp_path: Path
    ) -> None:
        (shm / "nccl-1").write_bytes(b"1")
        proc_root = tmp_path / "proc"
        (proc_root / "77" / "maps").mkdir(parents=True)
        report = remove_residue(ShmScanner(shm, proc_root=proc_root), interval_s=0, sleep=lambda _: None)
        assert report.removed == ()
        assert report.unreadable_pids == (77,)
        assert report.kept == ((str(shm / "nccl-1"), "holders unknown: 1 processes could not be inspected"),)
        assert (shm / "nccl-1").exists()
