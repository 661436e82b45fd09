"""Fault injection at journal boundaries (`KIND:STEP:PHASE:EVENT`, `KIND:state:STATE`, `*`
allowed), for the fault-injection tests and `make chaos` only; off unless settings name them.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from anvil_ctl.log import get_logger

log = get_logger("anvil.faults")


@dataclass(frozen=True)
class Faults:
    crash_at: str | None = None
    pause_at: str | None = None
    pause_file: Path | None = None

    def at(self, boundary: str) -> None:
        """Called by the engine right after the row of `boundary` commits."""
        if self.crash_at and fnmatch.fnmatchcase(boundary, self.crash_at):
            log.warning("crash_at boundary reached: SIGKILL", boundary=boundary)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause_at and self.pause_file and fnmatch.fnmatchcase(boundary, self.pause_at):
            log.warning("pause_at boundary reached: waiting", boundary=boundary, file=str(self.pause_file))
            self.pause_file.write_text(boundary + "\n")
            deadline = time.monotonic() + 600.0  # a forgotten pause file never hangs a run
            while self.pause_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)


NO_FAULTS = Faults()
