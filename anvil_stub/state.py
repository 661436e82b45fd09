"""The stub's shared state (counters, knobs, measured timings) and the pacing of its tokens."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections import deque

from anvil_stub.options import StubOptions
from anvil_stub.schedule import FATAL_LINE, Effects, effects

EXIT_AFTER_CODE = 1  # --exit-after looks like a crash to the runtime
RESTARTED_ENV = "ANVIL_STUB_RESTARTED"  # set across the re-exec: --restart-after restarts once
TIMINGS_KEPT = 1000  # completions whose measured timing GET /anvil/sim/timings reports


def log_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class StubState:
    def __init__(self, options: StubOptions, answer_book: list[tuple[str, str]]) -> None:
        self.options = options
        self.answer_book = answer_book
        self.started = time.monotonic()
        self.started_at = time.time()
        self.began_at: dict[str, float] = {}
        """Late fault kind -> the wall-clock time it first acted (`GET /anvil/sim/timings`)."""
        self.lock = threading.Lock()
        self.completions_started = 0
        self.completions_done = 0
        self.ids = itertools.count(1)
        self.stop = threading.Event()
        self.exit_code = 0
        self.restart = False
        self.logged = bool(os.environ.get(RESTARTED_ENV))  # printed before the restart already
        self.timings: deque[dict[str, object]] = deque(maxlen=TIMINGS_KEPT)
        """What the newest completions really took (Pacer.timing), with the late faults due for each."""
        self.timing_seq = itertools.count(1)
        self.fatal_logged = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def late_effects(self, completions: int) -> Effects:
        """What the late faults do to a completion that `completions` others preceded."""
        found = effects(self.options.late_faults, completions, self.elapsed())
        with self.lock:
            for kind in found.kinds:
                if kind not in ("fatal-log", "exit"):  # those act when they fire (`_late`)
                    self.began_at.setdefault(kind, time.time())
        return found

    def onsets(self) -> list[dict[str, object]]:
        """Each late fault's wall-clock onsets, due and begun (caller holds the lock)."""
        return [
            {
                "kind": f.kind,
                "due_at": None if f.after_s is None else round(self.started_at + f.after_s, 3),
                "after_completions": f.after_completions,
                "began_at": self.began_at.get(f.kind),
            }
            for f in self.options.late_faults
        ]

    def tick(self) -> None:
        """The late faults whose onset is a time: the fatal line, the exit."""
        with self.lock:
            self._late(self.completions_done)

    def _late(self, done: int) -> None:
        """Fire the late `fatal-log` (once) and `exit` faults now due (caller holds the lock)."""
        now = self.elapsed()
        for fault in self.options.late_faults:
            if not fault.due(done, now):
                continue
            if fault.kind == "fatal-log" and not self.fatal_logged:
                self.fatal_logged = True
                self.began_at.setdefault(fault.kind, time.time())
                log_line(FATAL_LINE)
            elif fault.kind == "exit" and not self.stop.is_set():
                self.began_at.setdefault(fault.kind, time.time())
                log_line("anvil-stub: exiting: injected fault (exit)")
                self.exit_code = EXIT_AFTER_CODE
                self.stop.set()

    @property
    def running(self) -> int:
        """Completions admitted and not finished: the gauge an engine publishes on /metrics."""
        with self.lock:
            return self.completions_started - self.completions_done

    def warming(self) -> bool:
        return time.monotonic() - self.started < self.options.slow_start

    def healthy(self) -> bool:
        return not self.options.fail_health and not self.warming()

    def admit(self) -> int | None:
        """Count a completion in and return how many others began before it; None once stopped."""
        with self.lock:
            limit = self.options.exit_after
            if (limit is not None and self.completions_started >= limit) or self.stop.is_set():
                return None
            self.completions_started += 1
            return self.completions_started - 1

    def finished(self) -> None:
        with self.lock:
            self.completions_done += 1
            self.print_log_lines()
            limit = self.options.exit_after
            if limit is not None and self.completions_done >= limit:
                self.exit_code = EXIT_AFTER_CODE
                self.stop.set()
            self._late(self.completions_done)
            again = self.options.restart_after
            if again is not None and self.completions_done >= again and not os.environ.get(RESTARTED_ENV):
                self.restart = True
                self.stop.set()

    def print_log_lines(self) -> None:
        """Print the --log-line lines once --log-after completions are done (under the lock)."""
        if not self.logged and self.completions_done >= self.options.log_after:
            self.logged = True
            for line in self.options.log_lines:
                log_line(line)

    def vram(self) -> dict[str, int]:
        o = self.options
        if not self.healthy():
            used = 0
        elif o.vram_loaded_mib is not None and self.completions_done >= o.vram_after_requests:
            used = o.vram_loaded_mib
        else:
            used = o.vram_idle_mib
        return dict.fromkeys(o.gpu_uuids, used)


class Pacer:
    """Sleeps until each token's absolute due time, noting when the first and last really went out."""

    def __init__(
        self, options: StubOptions, prompt_tokens: int, t0: float, late: Effects | None = None
    ) -> None:
        late = late or Effects()
        self.prefill_s = prompt_tokens / options.prefill_tps if options.prefill_tps > 0 else 0.0
        self.prefill_s += late.extra_first_token_s
        self.step_s = 1.0 / options.decode_tps if options.decode_tps > 0 else 0.0
        if late.decode_tps_cap is not None:
            self.step_s = max(self.step_s, 1.0 / late.decode_tps_cap)
        self.t0 = t0
        self.prompt_tokens = prompt_tokens
        self.first: float | None = None
        self.last: float | None = None
        self.emitted = 0

    def wait_for(self, index: int) -> None:
        due = self.t0 + self.prefill_s + index * self.step_s
        while (now := time.monotonic()) < due:
            time.sleep(due - now)
        self.first = now if self.first is None else self.first
        self.last, self.emitted = now, max(self.emitted, index + 1)

    def timing(self) -> dict[str, float] | None:
        """What this completion really took: prompt to first token, first to last token."""
        if self.first is None or self.last is None:
            return None
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.emitted,
            "prefill_s": self.first - self.t0,
            "decode_s": self.last - self.first,
        }
