"""The seeds' summary table of a qualification: per capacity cell and endurance run, the
nominal context, measured prompt, TTFT, prefill, decode and completed requests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anvil_ctl.core.jsontypes import JSONMapping, fields, get_float, items, whole

if TYPE_CHECKING:  # the CLI draws the table; a promote that labels cells skips rich
    from rich.table import Table


def context_label(tokens: int) -> str:
    """4096 -> '4K', 122880 -> '120K', 1000 -> '1000'."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


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


def _row(label: str, cell: JSONMapping) -> SummaryRow:
    if cell["concurrency"] != 1:
        label += f" C{cell['concurrency']}"
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


def summary_rows(evidence: Iterable[JSONMapping]) -> list[SummaryRow]:
    """Capacity cells and endurance runs of the gates' evidence, in gate order."""
    rows: list[SummaryRow] = []
    for ev in evidence:
        gate_type = ev.get("gate_type")
        if gate_type == "capacity":
            for item in items(ev.get("cells", [])):
                cell = fields(item)
                if not cell.get("skipped"):
                    rows.append(_row(context_label(whole(cell["nominal_tokens"])), cell))
        elif gate_type == "endurance" and "nominal_tokens" in ev:
            rows.append(_row(f"{context_label(whole(ev['nominal_tokens']))} endurance", ev))
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
    from rich.table import Table

    table = Table(title=title)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*_cells(row))
    return table
