"""Unavailable is not a bug: a database held by another process, read-only or full, and an
unreachable Docker Engine exit 7 naming the dependency, write nothing, and leave no stale pass.

The holder of the database is another process (a `sqlite3` connection in a child that
keeps `BEGIN EXCLUSIVE` open until we close its stdin). Commands run in this process
(`cli.main`), timed from call to return.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from anvil_ctl import cli, log
from anvil_ctl.core.states import ExitCode
from tests.unit.clirun import Ran
from tests.unit.fakehost import FakeHost
from tests.unit.hoststate import environ, host_state

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
if sys.argv[2] == "exclusive-locking":
    con.execute("PRAGMA locking_mode=EXCLUSIVE")
con.execute("BEGIN EXCLUSIVE")
if sys.argv[2] == "exclusive-locking":
    con.execute("CREATE TABLE held_by_test(x)")  # a write: the exclusive lock is really taken
print("held", flush=True)
sys.stdin.read()
con.execute("ROLLBACK")
"""

READ_ONLY = [
    ("status",),
    ("audit", "transactions"),
    ("audit", "verify"),
    ("audit", "incumbents"),
    ("audit", "rechecks"),
    ("waivers", "list"),
    ("lock", "status"),
]

MUTATIONS = [
    (
        "waive",
        "--policy",
        "vram-reserve",
        "--scope",
        "compute-a",
        "--value",
        "0",
        "--approved-by",
        "a",
        "--reason",
        "r",
        "--no-expiry",
    ),
    ("adopt", "{incumbent}", "--slot", "primary", "--context-tokens", "524288"),
    ("load", "stub-245k-c1", "--slot", "primary"),
    ("rollback", "--slot", "primary"),
    ("recheck", "--slot", "primary"),
]


@contextmanager
def held(db: Path, mode: str = "plain") -> Iterator[int]:
    """Another process holding `BEGIN EXCLUSIVE` on `db` until the block ends; yields its PID."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "held"
            yield proc.pid
        finally:
            proc.stdin.close()  # the holder rolls back and exits
            proc.wait(timeout=30)


@pytest.fixture
def run(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """`run(*argv, **env)`: cli.main on the fake host; returns (Ran, seconds)."""
    monkeypatch.setattr(log, "configure", lambda *_a, **_k: None)

    def call(*argv: str, **env: str) -> tuple[Ran, float]:
        values = {
            "ANVIL_BACKEND": "fake",
            "ANVIL_STATE_DIR": str(fake_host.settings.state_dir),
            "ANVIL_CONFIG": str(fake_host.settings.config),
            "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
            "ANVIL_LOG_FORMAT": "json",
            **env,
        }
        args = [a.replace("{incumbent}", fake_host.incumbent_id) for a in argv]
        capsys.readouterr()
        start = time.monotonic()
        with environ(values):
            code = cli.main(args)
        took = time.monotonic() - start
        out, err = capsys.readouterr()
        return Ran(code, out, err), took

    return call


def db_of(host: FakeHost) -> Path:
    return host.settings.state_dir / "anvil.db"


class TestADatabaseHeldByAnotherProcess:
    @pytest.mark.parametrize("argv", READ_ONLY, ids=" ".join)
    def test_read_only_commands_answer_within_5_seconds(
        self, run, fake_host: FakeHost, argv: tuple[str, ...]
    ) -> None:  # type: ignore[no-untyped-def]
        with held(db_of(fake_host)):
            r, took = run(*argv)
        assert r.code == ExitCode.OK, r.err
        assert took < 5.0

    @pytest.mark.parametrize("argv", READ_ONLY, ids=" ".join)
    def test_read_only_commands_exit_7_within_5_seconds_when_even_reading_is_locked(
        self, run, fake_host: FakeHost, argv: tuple[str, ...]
    ) -> None:  # type: ignore[no-untyped-def]
        """A holder in exclusive locking mode blocks readers too: they give up in time."""
        with held(db_of(fake_host), "exclusive-locking"):
            r, took = run(*argv)
        assert r.code in (ExitCode.OK, ExitCode.UNAVAILABLE), r.err
        assert took < 5.0
        if r.code == ExitCode.UNAVAILABLE:
            assert r.err.count("\n") == 1 and str(db_of(fake_host)) in r.err and "locked" in r.err

    @pytest.mark.parametrize("argv", MUTATIONS, ids=lambda a: a[0])
    def test_a_mutation_exits_7_naming_the_database_and_writes_nothing(
        self, run, fake_host: FakeHost, tmp_path: Path, argv: tuple[str, ...]
    ) -> None:  # type: ignore[no-untyped-def]
        (tmp_path / "untouched").mkdir()
        before = host_state(fake_host, tmp_path / "untouched")
        with held(db_of(fake_host)):
            r, _ = run(*argv)
        assert r.code == ExitCode.UNAVAILABLE, r.err or r.out
        if argv[0] != "recheck":  # recheck reports on stdout (and in its textfile), see below
            assert r.err.startswith("anvilctl: error: state database ") and r.err.count("\n") == 1
            assert str(db_of(fake_host)) in r.err and "locked" in r.err
        assert "Traceback" not in r.err
        assert host_state(fake_host, tmp_path / "untouched") == before

    def test_a_recheck_that_cannot_record_still_says_so_in_its_textfile(
        self, run, fake_host: FakeHost, tmp_path: Path
    ) -> None:  # type: ignore[no-untyped-def]
        prom = tmp_path / "anvil.prom"
        r, _ = run("recheck", "--textfile", str(prom))
        assert r.code == ExitCode.OK and 'anvil_recheck_passed{slot="primary"} 1' in prom.read_text()
        with held(db_of(fake_host)):
            r, _ = run("recheck", "--textfile", str(prom))
        assert r.code == ExitCode.UNAVAILABLE and "NOT recorded" in r.out
        text = prom.read_text()
        assert 'anvil_recheck_up{slot="primary"} 0' in text
        assert 'anvil_recheck_passed{slot="primary"} 0' in text


def _no_file_growth() -> None:
    """In the child: no write may reach past byte 1 of any file (a disk that is full)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))


class TestAFullDisk:
    def test_a_mutation_exits_7_and_the_database_stays_intact(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        (tmp_path / "untouched").mkdir()
        before = host_state(fake_host, tmp_path / "untouched")
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", *MUTATIONS[0]],
            env=fake_host.env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            preexec_fn=_no_file_growth,
            timeout=120,
        )
        assert r.returncode == ExitCode.UNAVAILABLE, r.stderr
        assert r.stderr.startswith("anvilctl: error: state database ") and "Traceback" not in r.stderr
        assert host_state(fake_host, tmp_path / "untouched") == before
        con = sqlite3.connect(db_of(fake_host))
        try:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            con.close()


def _can_mount_read_only() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs root and unshare to mount the state read-only")
class TestAReadOnlyStateDirectory:
    def _in_read_only_mount(self, host: FakeHost, *argv: str) -> subprocess.CompletedProcess[str]:
        state = str(host.settings.state_dir)
        script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", state, sys.executable, "-m", "anvil_ctl", *argv],
            env=host.env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def test_read_only_commands_answer_or_exit_7_naming_the_database(self, fake_host: FakeHost) -> None:
        """SQLite reads a WAL database on read-only media only while its -wal/-shm files exist."""
        r = self._in_read_only_mount(fake_host, "audit", "transactions")
        assert r.returncode in (ExitCode.OK, ExitCode.UNAVAILABLE), r.stderr
        if r.returncode == ExitCode.UNAVAILABLE:
            assert str(db_of(fake_host)) in r.stderr and "read-only" in r.stderr

    def test_a_mutation_exits_7_saying_read_only(self, fake_host: FakeHost, tmp_path: Path) -> None:
        (tmp_path / "untouched").mkdir()
        before = host_state(fake_host, tmp_path / "untouched")
        r = self._in_read_only_mount(fake_host, *MUTATIONS[0])
        assert r.returncode == ExitCode.UNAVAILABLE, r.stderr
        assert "read-only" in r.stderr and r.stderr.count("\n") == 1
        assert host_state(fake_host, tmp_path / "untouched") == before


class TestAnUnreachableDockerEngine:
    def _real(self, host: FakeHost, tmp_path: Path) -> dict[str, str]:
        return {
            "ANVIL_BACKEND": "real",
            "ANVIL_GPU": "simulated",
            "ANVIL_DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        }

    def test_status_exits_7_naming_docker(self, run, fake_host: FakeHost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        r, _ = run("status", **self._real(fake_host, tmp_path))
        assert r.code == ExitCode.UNAVAILABLE
        assert r.err.count("\n") == 1 and "Docker Engine" in r.err

    def test_recheck_records_that_it_could_not_observe_and_replaces_a_stale_pass(
        self, run, fake_host: FakeHost, tmp_path: Path
    ) -> None:  # type: ignore[no-untyped-def]
        prom = tmp_path / "anvil.prom"
        r, _ = run("recheck", "--textfile", str(prom))
        assert r.code == ExitCode.OK and 'anvil_recheck_passed{slot="primary"} 1' in prom.read_text()

        r, _ = run("--json", "recheck", "--textfile", str(prom), **self._real(fake_host, tmp_path))
        assert r.code == ExitCode.UNAVAILABLE, r.err
        result = r.json()
        assert result["up"] is False and "Docker Engine" in result["unavailable"]
        assert result["recheck_id"] is not None and result["failed"] == ["observed"]
        text = prom.read_text()
        assert 'anvil_recheck_up{slot="primary"} 0' in text
        assert 'anvil_recheck_passed{slot="primary"} 0' in text
        assert "anvil_recheck_assertion{" not in text  # no stale assertion either
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

        r, _ = run("--json", "audit", "rechecks", "--limit", "1")
        assert r.json()[0]["passed"] in (0, False) and "observed" in str(r.json()[0])
