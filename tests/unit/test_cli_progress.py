"""Progress: a load's steps appear as they happen, live on a terminal, as lines on a pipe,
and not at all with --json (anvil_ctl.cli.progress; the engine reports through its port)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from anvil_ctl.cli.progress import LiveProgress, PlainProgress, for_stream
from anvil_ctl.core.ports import SilentProgress
from tests.unit.clirun import REPO
from tests.unit.fakehost import FakeHost

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\r")
STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z ")
PAUSE_AT = "load:start-candidate:do:result"


def fake_recipe(fake_host: FakeHost) -> Path:
    """A recipe the fake backend can load: its image is in the fake world."""
    d = fake_host.root / "recipes"
    d.mkdir(exist_ok=True)
    (d / "fake-393k.toml").write_text(
        f"""
name = "fake-393k"
engine = "stub"
image = "{fake_host.image_id}"
served_model = "cand-393k"
context_tokens = 393216
max_concurrency = 1
tp_size = 2
gpu_roles = ["compute-a", "compute-b"]
port = 8001
startup_timeout_s = 5.0
profile = "smoke"

[env]
FAKE_VRAM_MIB = "94000"
"""
    )
    return d


def load_argv(fake_host: FakeHost, *extra: str) -> list[str]:
    recipes = fake_recipe(fake_host)
    return [
        sys.executable,
        "-m",
        "anvil_ctl",
        "load",
        "fake-393k",
        "--slot",
        "primary",
        "--recipes-dir",
        str(recipes),
        *extra,
    ]


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class TestOnATerminal:
    def test_step_lines_appear_while_the_load_runs_then_the_live_line_is_gone(
        self, fake_host: FakeHost
    ) -> None:
        pause = fake_host.settings.pause_file
        env = fake_host.env() | {"ANVIL_PAUSE_AT": PAUSE_AT, "COLUMNS": "120", "TERM": "xterm"}
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            load_argv(fake_host), cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
        os.close(slave)
        seen = bytearray()

        def read_some() -> None:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):  # OSError: the child closed the terminal
                    seen.extend(os.read(master, 65536))

        def screen() -> str:
            return ANSI.sub("", seen.decode(errors="replace"))

        try:
            wait_for(lambda: (read_some(), pause.exists())[1], "the load to pause after start-candidate")
            wait_for(lambda: (read_some(), "start-candidate" in screen())[1], "start-candidate on screen")
            # Paused inside the transaction: the command has not ended, its steps are on screen.
            assert proc.poll() is None
            so_far = screen()
            assert "load " in so_far and "on slot primary" in so_far
            assert re.search(r"✓ \[1/\d+\] drain-tier\s+\d+\.\d s", so_far), so_far
            assert re.search(r"✓ \[\d/\d+\] stop-incumbent\s+\d+\.\d s", so_far), so_far
            assert "committed" not in so_far
            pause.unlink()
            wait_for(lambda: (read_some(), proc.poll() is not None)[1], "the load to finish")
            for _ in range(20):
                read_some()
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        assert proc.returncode == 0, screen()
        final = screen()
        assert re.search(r"✓ \[\d/\d+\] await-candidate\s+\d+\.\d s", final), final
        assert "load committed after" in final
        assert "load: committed  (transaction " in final  # the result, after the progress


class TestOnAPipe:
    def test_plain_timestamped_lines_arrive_before_the_load_ends(self, fake_host: FakeHost) -> None:
        pause = fake_host.settings.pause_file
        env = fake_host.env() | {"ANVIL_PAUSE_AT": PAUSE_AT}
        proc = subprocess.Popen(
            load_argv(fake_host), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stderr is not None and proc.stdout is not None
        lines: list[str] = []
        # A thread reads stderr, so that the wait below has a deadline even if a line never comes.
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        try:
            wait_for(pause.exists, "the load to pause after start-candidate")
            # The pause holds the transaction after start-candidate's result: its start line and
            # the steps before it are on the pipe already.
            wait_for(
                lambda: any("[4/6] start-candidate: create" in line for line in lines), "start-candidate"
            )
            assert proc.poll() is None  # still inside the transaction
            assert not any("committed" in line for line in lines if not line.startswith("{"))
            pause.unlink()
            out = proc.stdout.read()
            proc.wait(timeout=120)
            reader.join(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == 0, "".join(lines)
        progress = [line for line in lines if not line.startswith("{")]  # JSON log lines aside
        assert progress and all(STAMP.match(line) for line in progress), progress
        text = "".join(progress)
        assert "\x1b" not in text
        assert re.search(r"\[1/\d+\] drain-tier: done in \d+\.\d s", text)
        assert "waiting for http://127.0.0.1:8001 to serve cand-393k (deadline 5 s)" in text
        assert re.search(r"load committed after \d+\.\d s", text)
        assert out.startswith("load: committed  (transaction ")

    def test_with_json_stdout_is_one_document_and_no_progress_is_printed(self, fake_host: FakeHost) -> None:
        r = subprocess.run(
            [*load_argv(fake_host), "--json"], cwd=REPO, env=fake_host.env(), capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "committed"
        assert not [line for line in r.stderr.splitlines() if STAMP.match(line)]
        assert "drain-tier: done" not in r.stderr


class TestRenderers:
    def test_json_output_gets_silent_progress(self) -> None:
        assert isinstance(for_stream(io.StringIO(), json_output=True), SilentProgress)

    def test_a_quiet_wait_gets_a_still_waiting_line_on_a_pipe(self) -> None:
        stream = io.StringIO()
        progress = PlainProgress(stream, heartbeat_s=0.2)
        progress.transaction("t1", "load", "primary", 3)
        progress.step_started(2, "release-vram", "do", "wait until the GPUs' memory is observed free")
        progress.waiting("VRAM release on compute-a, compute-b", 120.0)
        try:
            wait_for(lambda: "still" in stream.getvalue() or "..." in stream.getvalue(), "a heartbeat", 10)
        finally:
            progress.step_finished(2, "release-vram", "do", ok=True, elapsed_s=0.5, error="")
            progress.finished("committed", "", 0.6)
        text = stream.getvalue()
        assert re.search(
            r"\.\.\. \[3/3\] release-vram: \d+\.\d s, waiting for VRAM release on compute-a, compute-b: "
            r"\d+\.\d s of 120 s",
            text,
        ), text
        assert text.rstrip().endswith("load committed after 0.6 s")

    def test_a_failed_step_and_its_undo_say_so_with_the_error(self) -> None:
        console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
        progress = LiveProgress(console)
        progress.transaction("t1", "load", "primary", 2)
        progress.step_started(0, "drain-tier", "do", "quiesce")
        progress.step_finished(0, "drain-tier", "do", ok=True, elapsed_s=0.3, error="")
        progress.step_started(1, "start-candidate", "do", "start")
        progress.step_finished(1, "start-candidate", "do", ok=False, elapsed_s=1.0, error="no \x1b[2J health")
        progress.step_started(0, "drain-tier", "undo", "undo: quiesce")
        progress.step_finished(0, "drain-tier", "undo", ok=True, elapsed_s=0.2, error="")
        progress.finished("compensated", "start-candidate: no health", 1.6)
        text = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
        assert "✓ [1/2] drain-tier  0.3 s" in text
        assert "✗ [2/2] start-candidate  1.0 s: no \\x1b[2J health" in text  # escaped, never obeyed
        assert "✓ undo [1/2] drain-tier  0.2 s" in text
        assert "load compensated after 1.6 s: start-candidate: no health" in text


@pytest.mark.parametrize("stream_is_tty", [True, False])
def test_for_stream_picks_live_on_a_terminal_and_lines_otherwise(stream_is_tty: bool) -> None:
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return stream_is_tty

    chosen = for_stream(Stream(), json_output=False)
    assert isinstance(chosen, LiveProgress if stream_is_tty else PlainProgress)


class TestGateProgress:
    def test_a_gate_verdict_names_its_place_in_the_run(self) -> None:
        from anvil_ctl.cli.progress import GateProgress
        from anvil_ctl.qualify.results import GateResult

        stream = io.StringIO()
        plain = PlainProgress(stream, heartbeat_s=0)
        plain.transaction("t1", "qualify", "primary", 2)
        gates = GateProgress(plain)
        gates.gate_started("vram_reserve", 16, 17)
        gates.gate_finished(
            GateResult("vram_reserve", True, "policy", "pass", summary="all cards keep", duration_s=0.2)
        )
        assert re.search(
            r"Z     gate \[16/17\] vram_reserve: PASS all cards keep \[0\.2 s\]$", stream.getvalue(), re.M
        )


class TestCommandsThatAreNotTransactions:
    """init, recheck and evidence report say what they are doing while they do it."""

    def test_on_a_terminal_a_spinner_line_while_it_works(self) -> None:
        from anvil_ctl.cli.progress import working

        buf = io.StringIO()
        console = Console(file=buf, force_terminal=True, width=100, markup=False, highlight=False)
        with working(LiveProgress(console), "init: creating or upgrading the state database"):
            wait_for(lambda: "init: creating or upgrading" in ANSI.sub("", buf.getvalue()), "the spinner", 10)

    def test_a_transaction_inside_the_work_takes_the_terminal_over(self) -> None:
        """recheck --repair runs a reconcile transaction and recover runs several inside their
        own work: rich allows one live display at a time, so the transaction's replaces it."""
        from anvil_ctl.cli.progress import working

        buf = io.StringIO()
        progress = LiveProgress(Console(file=buf, force_terminal=True, width=100, markup=False))
        with working(progress, "recheck: observing slot primary and checking its goals"):
            progress.transaction("t1", "reconcile", "primary", 1)
            progress.step_started(0, "route", "do", "re-apply the route")
            progress.step_finished(0, "route", "do", ok=True, elapsed_s=0.1, error="")
            progress.finished("committed", "", 0.2)
        assert "reconcile committed after" in ANSI.sub("", buf.getvalue())

    def test_with_json_nothing(self) -> None:
        from anvil_ctl.cli.progress import working

        stream = io.StringIO()
        with working(for_stream(stream, json_output=True), "init"):
            pass
        assert stream.getvalue() == ""

    @pytest.mark.parametrize(
        ("argv", "doing"),
        [
            (["init"], "init: creating or upgrading the state database"),
            (["recheck", "--slot", "primary"], "recheck: observing slot primary and checking its goals"),
        ],
    )
    def test_init_and_recheck_show_a_live_line_on_a_terminal_and_add_nothing_to_a_pipe(
        self, fake_host: FakeHost, argv: list[str], doing: str
    ) -> None:
        env = fake_host.env() | {"COLUMNS": "120", "TERM": "xterm"}
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "anvil_ctl", *argv],
            cwd=REPO,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        seen = bytearray()
        try:
            while True:
                ready, _, _ = select.select([master], [], [], 0.1)
                if ready:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:  # the child closed the terminal
                        break
                    if not chunk:
                        break
                    seen.extend(chunk)
                elif proc.poll() is not None:
                    break
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        assert doing in ANSI.sub("", seen.decode(errors="replace")), seen
        piped = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", *argv],
            cwd=REPO,
            env=fake_host.env(),
            capture_output=True,
            text=True,
        )
        assert doing not in "".join(
            line for line in piped.stderr.splitlines(keepends=True) if not line.startswith("{")
        ), piped.stderr
