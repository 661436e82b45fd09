"""Operator-facing output: live progress (rich on a TTY, plain lines otherwise) and the
seeds' summary table (context, measured prompt, TTFT, prefill, decode, completed).

Progress writes to the stream it is given (stderr from the CLI); nothing here
prints on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, TextIO

from rich.console import Console
from rich.status import Status
from rich.table import Table

from anvil_ctl.core.jsontypes import JSONMapping, JSONObject, get_float
from anvil_ctl.qualify.metrics import context_label
from anvil_ctl.qualify.narrow import fields, items, whole
from anvil_ctl.qualify.results import GateResult


class Progress(Protocol):
    """What the runner reports while it works."""

    def run_started(self, profile: str, gates: Sequence[str]) -> None: ...

    def gate_started(self, name: str, index: int, total: int) -> None: ...

    def request_done(self, gate: str, ok: bool, detail: str) -> None: ...

    def gate_finished(self, result: GateResult) -> None: ...

    def run_finished(self, outcome: str) -> None: ...


class NullProgress:
    """Reports nothing (library callers, --json)."""

    def run_started(self, profile: str, gates: Sequence[str]) -> None:
        return None

    def gate_started(self, name: str, index: int, total: int) -> None:
        return None

    def request_done(self, gate: str, ok: bool, detail: str) -> None:
        return None

    def gate_finished(self, result: GateResult) -> None:
        return None

    def run_finished(self, outcome: str) -> None:
        return None


class PlainProgress(NullProgress):
    """One line per gate start and end, and per failed request; no terminal control."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def run_started(self, profile: str, gates: Sequence[str]) -> None:
        self._line(f"qualify: profile {profile}: {len(gates)} gates: {', '.join(gates)}")

    def gate_started(self, name: str, index: int, total: int) -> None:
        self._line(f"[{index}/{total}] {name} ...")

    def request_done(self, gate: str, ok: bool, detail: str) -> None:
        if not ok:
            self._line(f"    {gate}: FAIL {detail}")

    def gate_finished(self, result: GateResult) -> None:
        verdict = "PASS" if result.passed else f"FAIL ({result.classification})"
        self._line(f"    {result.name}: {verdict} {result.summary} [{result.duration_s:.2f}s]")

    def run_finished(self, outcome: str) -> None:
        self._line(f"qualify: decision {outcome}")


class RichProgress(PlainProgress):
    """A live status line with request counts, and colored gate verdicts."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._status: Status | None = None
        self._gate = ""
        self._ok = 0
        self._failed = 0
        self._label = ""

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def gate_started(self, name: str, index: int, total: int) -> None:
        self._gate, self._ok, self._failed = name, 0, 0
        self._label = f"[{index}/{total}] {name}"
        status = self.console.status(f"{self._label} running")
        status.start()
        self._status = status

    def request_done(self, gate: str, ok: bool, detail: str) -> None:
        if ok:
            self._ok += 1
        else:
            self._failed += 1
            self.console.print(f"    [red]{gate}: FAIL[/red] {detail}", highlight=False)
        if self._status is not None:
            self._status.update(f"{self._label}: {self._ok} ok, {self._failed} failed")

    def gate_finished(self, result: GateResult) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        verdict = "[green]PASS[/green]" if result.passed else f"[red]FAIL ({result.classification})[/red]"
        self.console.print(
            f"  {result.name}: {verdict} {result.summary} [dim]{result.duration_s:.2f}s[/dim]",
            highlight=False,
        )


def make_progress(stream: TextIO | None) -> Progress:
    """Rich on a TTY, plain lines otherwise, nothing without a stream."""
    if stream is None:
        return NullProgress()
    if stream.isatty():
        return RichProgress(Console(file=stream))
    return PlainProgress(stream)


@dataclass(frozen=True)
class SummaryRow:
    """One row of the seeds' table: a capacity cell or an endurance run."""

    label: str
    nominal_tokens: int
    concurrency: int
    measured_prompt_p50: float | None
    ttft_p50_s: float | None
    ttfo_p50_s: float | None
    prefill_p50_tps: float | None
    decode_p50_tps: float | None
    completed: int
    requests: int

    def as_dict(self) -> JSONObject:
        return asdict(self)


def _row(label: str, cell: JSONMapping) -> SummaryRow:
    return SummaryRow(
        label=label,
        nominal_tokens=whole(cell["nominal_tokens"]),
        concurrency=whole(cell["concurrency"]),
        measured_prompt_p50=get_float(cell, "prompt_tokens_p50"),
        ttft_p50_s=get_float(cell, "ttft_s_p50"),
        ttfo_p50_s=get_float(cell, "ttfo_s_p50"),
        prefill_p50_tps=get_float(cell, "prefill_tps_p50"),
        decode_p50_tps=get_float(cell, "decode_tps_p50"),
        completed=whole(cell.get("completed", 0)),
        requests=whole(cell.get("requests", 0)),
    )


def summary_rows(results: Sequence[GateResult]) -> list[SummaryRow]:
    """Capacity cells and endurance runs, in gate order."""
    rows: list[SummaryRow] = []
    for result in results:
        gate_type = result.evidence.get("gate_type")
        if gate_type == "capacity":
            for item in items(result.evidence.get("cells", [])):
                cell = fields(item)
                if cell.get("skipped"):
                    continue
                label = context_label(whole(cell["nominal_tokens"]))
                if cell["concurrency"] != 1:
                    label += f" C{cell['concurrency']}"
                rows.append(_row(label, cell))
        elif gate_type == "endurance" and "nominal_tokens" in result.evidence:
            ev = result.evidence
            label = f"{context_label(whole(ev['nominal_tokens']))} endurance"
            if ev["concurrency"] != 1:
                label += f" C{ev['concurrency']}"
            rows.append(_row(label, ev))
    return rows


HEADERS = (
    "Nominal context",
    "Measured prompt p50",
    "TTFT p50",
    "Effective prefill p50",
    "Decode p50",
    "Completed",
)


def _cells(row: SummaryRow) -> tuple[str, ...]:
    def num(value: float | None, unit: str = "", digits: int = 0) -> str:
        return "-" if value is None else f"{value:,.{digits}f}{unit}"

    return (
        row.label,
        num(row.measured_prompt_p50),
        num(row.ttft_p50_s if row.ttft_p50_s is not None else row.ttfo_p50_s, " s", 3),
        num(row.prefill_p50_tps, " tok/s"),
        num(row.decode_p50_tps, " tok/s", 2),
        f"{row.completed}/{row.requests}",
    )


def render_summary(rows: Sequence[SummaryRow]) -> str:
    """The summary as aligned plain text (tab-free, one line per row)."""
    table = [HEADERS, *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_table(rows: Sequence[SummaryRow], title: str = "Capacity") -> Table:
    """The summary as a rich Table."""
    table = Table(title=title)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*_cells(row))
    return table


def render_gates(results: Sequence[GateResult]) -> str:
    """One line per gate: verdict, kind, classification, summary."""
    width = max((len(r.name) for r in results), default=4)
    return "\n".join(
        f"{r.name.ljust(width)}  {'PASS' if r.passed else 'FAIL'}  {r.kind:<10}  "
        f"{r.classification:<32}  {r.summary}".rstrip()
        for r in results
    )
