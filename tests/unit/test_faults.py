"""The fault-injection boundaries: crash and pause exactly where named, nowhere else."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from anvil_ctl.engine.runner import Faults


class TestCrashAt:
    def test_a_matching_boundary_kills_the_process_with_sigkill(self) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                Faults(crash_at="load:*:do:result").at("load:start-candidate:do:result")
            finally:
                os._exit(0)  # reached only if the crash did not happen
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    def test_another_boundary_does_nothing(self) -> None:
        Faults(crash_at="load:start-candidate:do:result").at("load:start-candidate:do:intent")
        Faults().at("load:start-candidate:do:result")


class TestPauseAt:
    def test_a_matching_boundary_waits_until_the_pause_file_is_removed(self, tmp_path: Path) -> None:
        pause = tmp_path / "paused-at"
        seen: list[str] = []

        def release() -> None:
            deadline = time.monotonic() + 10
            while not pause.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(pause.read_text().strip())
            pause.unlink()

        helper = threading.Thread(target=release)
        helper.start()
        Faults(pause_at="promote:route-to-candidate:do:result", pause_file=pause).at(
            "promote:route-to-candidate:do:result"
        )
        helper.join()
        assert seen == ["promote:route-to-candidate:do:result"]
        assert not pause.exists()

    def test_no_pause_file_is_written_at_other_boundaries(self, tmp_path: Path) -> None:
        pause = tmp_path / "paused-at"
        Faults(pause_at="promote:*:undo:*", pause_file=pause).at("promote:route-to-candidate:do:result")
        assert not pause.exists()
