"""A script that started a router stops it when it is sent SIGTERM (`scripts.routers.exit_on_sigterm`).

The child below stands for chaos.py or a benchmark: it starts a long-lived process the way
the scripts start smg (a `routers.Proc`), stops it in `finally`, and waits. Python's
default for SIGTERM kills the script at once and leaves that process running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import subprocess, sys, time
from pathlib import Path
from scripts.routers import Proc, exit_on_sigterm
if sys.argv[1] == "handled":
    exit_on_sigterm()
sleeper = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)  # not our stdout: EOF when we die
router = Proc("router", sleeper, "http://127.0.0.1:1", Path("/dev/null"))
try:
    print(router.pid, flush=True)
    time.sleep(600)
finally:
    router.stop()
    print("stopped", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its dead parent's reaper) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _run(mode: str) -> tuple[int, str, int]:
    """(exit status, stdout after the PID line, the stand-in router's PID) of a SIGTERMed child."""
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        router_pid = int(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        return proc.wait(timeout=30), rest, router_pid


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_runs_finally_and_stops_the_router() -> None:
    code, out, router_pid = _run("handled")
    assert code == 128 + signal.SIGTERM
    assert out.strip() == "stopped"
    assert _gone_within(router_pid, 10)


def test_without_it_the_router_outlives_the_script() -> None:
    """The fault the handler exists for: the default SIGTERM leaves the router running."""
    code, out, router_pid = _run("default")
    try:
        assert code == -signal.SIGTERM
        assert out == ""
        assert _alive(router_pid)
    finally:
        try:
            os.kill(router_pid, signal.SIGKILL)
        except ProcessLookupError:
            pytest.fail("the stand-in router was already gone")
