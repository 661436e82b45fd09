"""What a person sees while a transaction runs: the engine's `Progress` port, rendered on stderr.

A live display on a terminal, timestamped lines (with a heartbeat) on a pipe, nothing with
`--json`. Warning: every text goes through `escape_text`; rich prints it as text, never markup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from anvil_ctl.core.ports import Progress, SilentProgress
from anvil_ctl.core.validate import escape_text

# rich is imported where a terminal display is drawn (`for_stream` on a TTY, `LiveProgress`),
# not here: a command on a pipe, a cron job's recheck, never loads it
if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from anvil_ctl.qualify.results import GateResult

HEARTBEAT_S = 2.0
"""Plain progress: after this many quiet seconds inside a step, a "still ..." line."""


def for_stream(stream: TextIO, *, json_output: bool, heartbeat_s: float = HEARTBEAT_S) -> Progress:
    """The renderer for this invocation: nothing with --json, live on a terminal, else lines."""
    if json_output:
        return SilentProgress()
    if stream.isatty():
        from rich.console import Console

        return LiveProgress(Console(file=stream, highlight=False, markup=False, emoji=False))
    return PlainProgress(stream, heartbeat_s=heartbeat_s)


def seconds(value: float) -> str:
    """`0.4 s`, `12.3 s`, `2 min 05 s`."""
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes} min {rest:02d} s"


@dataclass
class _Running:
    """The step now running, and what it waits for."""

    label: str
    started: float
    waiting: str = ""
    wait_started: float = 0.0
    deadline_s: float = 0.0
    activity: str = ""


class _Display(Progress):
    """What both renderers track (the transaction, the running step and its wait) and say.

    A renderer says a line with `_say`, starts and stops its own machinery (the heartbeat,
    the live area) with `_start` and `_stop`, and words a step's end with DONE and FAILED.
    """

    HEAD = "{kind} {tx_id}{where}: {steps} steps"
    DONE = ""
    FAILED = ""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.kind = ""
        self.steps = 0
        self.running: _Running | None = None

    def _label(self, seq: int, name: str, phase: str) -> str:
        if phase == "check":
            return "checks"
        where = f"[{seq + 1}/{self.steps}]" if self.steps else f"[{seq + 1}]"
        return f"undo {where} {name}" if phase == "undo" else f"{where} {name}"

    def _say(self, text: str, style: str = "") -> None:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def transaction(self, tx_id: str, kind: str, slot: str | None, steps: int) -> None:
        # A transaction inside a command's own work (recheck --repair, recover) takes the
        # terminal over: rich allows one live display at a time.
        self._stop()
        self.kind, self.steps = kind, steps
        where = f" on slot {slot}" if slot else ""
        self._say(self.HEAD.format(kind=kind, tx_id=tx_id, where=where, steps=steps), "bold")
        self._start()

    def step_started(self, seq: int, name: str, phase: str, description: str) -> None:
        self.running = _Running(self._label(seq, name, phase), self.clock())

    def step_finished(
        self, seq: int, name: str, phase: str, *, ok: bool, elapsed_s: float, error: str
    ) -> None:
        self.running = None
        label, took = self._label(seq, name, phase), seconds(elapsed_s)
        if ok:
            self._say(self.DONE.format(label=label, took=took), "green" if phase != "undo" else "yellow")
        else:
            self._say(self.FAILED.format(label=label, took=took, error=error), "red")

    def waiting(self, what: str, deadline_s: float) -> None:
        r = self.running
        if r is not None:
            r.waiting, r.wait_started, r.deadline_s = what, self.clock(), deadline_s

    def activity(self, text: str) -> None:
        if self.running is not None:
            self.running.activity = text

    def note(self, text: str) -> None:
        self._say(f"    {text}")

    def finished(self, state: str, reason: str, elapsed_s: float) -> None:
        self._stop()
        self.running = None
        because = f": {reason}" if reason and state != "committed" else ""
        line = f"{self.kind} {state} after {seconds(elapsed_s)}{because}"
        self._say(line, "green" if state == "committed" else "red")

    def wait_text(self) -> str:
        r = self.running
        if r is None or not r.waiting:
            return ""
        waited = self.clock() - r.wait_started
        return f"waiting for {r.waiting}: {seconds(waited)} of {r.deadline_s:g} s"


class PlainProgress(_Display):
    """Timestamped lines (RFC 3339 UTC) for a pipe or a log file: no terminal control."""

    HEAD = "{kind} {tx_id}: {steps} steps{where}"
    DONE = "  {label}: done in {took}"
    FAILED = "  {label}: FAILED after {took}: {error}"

    def __init__(
        self,
        stream: TextIO,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(clock)
        self.stream = stream
        self.heartbeat_s = heartbeat_s
        self._now = now
        self._lock = threading.Lock()
        self._last = clock()
        self._beat_stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _say(self, text: str, style: str = "") -> None:
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            self.stream.write(f"{stamp} {escape_text(text)}\n")
            self.stream.flush()
            self._last = self.clock()

    def _start(self) -> None:
        """A quiet step still says it is alive, every `heartbeat_s`."""
        if self.heartbeat_s <= 0 or self._beat is not None:
            return
        self._beat_stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="anvil-progress", daemon=True)
        self._beat.start()

    def _stop(self) -> None:
        self._beat_stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1.0)
        self._beat = None

    def _heartbeat(self) -> None:
        tick = min(0.25, self.heartbeat_s / 4)
        while not self._beat_stop.wait(tick):
            running = self.running
            if running is None or self.clock() - self._last < self.heartbeat_s:
                continue
            busy = seconds(self.clock() - running.started)
            detail = self.wait_text() or running.activity or "working"
            self._say(f"    ... {running.label}: {busy}, {detail}")

    def step_started(self, seq: int, name: str, phase: str, description: str) -> None:
        super().step_started(seq, name, phase, description)
        self._say(f"  {self._label(seq, name, phase)}: {description}")

    def waiting(self, what: str, deadline_s: float) -> None:
        super().waiting(what, deadline_s)
        self._say(f"    waiting for {what} (deadline {deadline_s:g} s)")


class LiveProgress(_Display):
    """On a terminal: a line per finished step, a live line for the running one (rich)."""

    DONE = "  ✓ {label}  {took}"
    FAILED = "  ✗ {label}  {took}: {error}"
    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __rich__(self) -> RenderableType:
        """The live area under the finished steps: spinner, running step, elapsed, wait."""
        from rich.console import Group
        from rich.text import Text

        r = self.running
        if r is None:
            return Text("")
        busy = seconds(self.clock() - r.started)
        frame = self.FRAMES[int(time.monotonic() * 10) % len(self.FRAMES)]
        head = Text.assemble((frame, "cyan"), " ", escape_text(r.label), "  ", busy)
        lines: list[RenderableType] = [head]
        wait = self.wait_text()
        if wait:
            lines.append(Text("    " + escape_text(wait), style="dim"))
        if r.activity:
            lines.append(Text("    " + escape_text(r.activity), style="dim"))
        return Group(*lines)

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.console = console
        self._live: Live | None = None

    def _say(self, text: str, style: str = "") -> None:
        from rich.text import Text

        self.console.print(Text(escape_text(text), style=style))

    def _start(self) -> None:
        """The transient live area under the printed lines (one at a time: rich's rule)."""
        from rich.live import Live

        self._stop()
        self._live = Live(
            self,
            console=self.console,
            refresh_per_second=8,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def begin(self, what: str) -> None:
        """A command that is not a transaction starts `what` (see `working`): a live line."""
        self._stop()
        self.running = _Running(what, self.clock())
        self._start()

    def end(self) -> None:
        self._stop()
        self.running = None


@contextmanager
def working(progress: Progress, what: str) -> Iterator[None]:
    """On a terminal only, a transient live line of what a non-transaction command is doing."""
    if isinstance(progress, LiveProgress):
        progress.begin(what)
        try:
            yield
        finally:
            progress.end()
    else:
        yield


class GateProgress:
    """The qualification runner's progress as notes and activity of the transaction's."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._label = ""
        self._ok = self._failed = 0

    def run_started(self, profile: str, gates: Sequence[str]) -> None:
        self.progress.note(f"qualify: profile {profile}: {len(gates)} gates: {', '.join(gates)}")

    def gate_started(self, name: str, index: int, total: int) -> None:
        self._label, self._ok, self._failed = f"gate [{index}/{total}] {name}", 0, 0
        self.progress.activity(self._label)

    def request_done(self, gate: str, ok: bool, detail: str) -> None:
        if ok:
            self._ok += 1
        else:
            self._failed += 1
            self.progress.note(f"{gate}: request FAILED {detail}")
        self.progress.activity(f"{self._label}: {self._ok} requests ok, {self._failed} failed")

    def gate_finished(self, result: GateResult) -> None:
        verdict = "PASS" if result.passed else f"FAIL ({result.classification})"
        # `gate [16/17] vram_reserve: PASS ...`: the gate's place in the run, as it started.
        label = self._label if self._label.endswith(f"] {result.name}") else result.name
        self.progress.note(f"{label}: {verdict} {result.summary} [{seconds(result.duration_s)}]")

    def run_finished(self, outcome: str) -> None:
        self.progress.note(f"qualify: decision {outcome}")
