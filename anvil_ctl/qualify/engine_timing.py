"""Cross-check a capacity gate against the engine's own timing lines in its log.

An engine whose profile names `timing` lines (llama.cpp's `llama_perf_context_print`)
prints one block per completion: prompt eval (ms, tokens evaluated), eval (ms, decode
steps) and total (ms, from the start of the completion to the end of its last step).
Read with timestamps (`docker logs --timestamps`), each block is matched to the capacity
row whose request was in flight when it was printed (the engine prints it just before
it sends the last chunk; the follow-up that counts a prompt evaluates one token), and
the cell's p50 figures are compared with the engine's:

- prefill: the gate's `prefill_tps` against the engine's prompt-eval tokens per second,
  and against prompt tokens over (total - eval): everything before the first decode step;
- decode: the gate's `decode_tps` against the engine's eval tokens per second.

llama.cpp's prompt-eval time is sometimes implausible: a fraction of a millisecond for
hundreds of tokens while (total - eval) is seconds (docs/ENGINES.md). A block whose
prompt-eval time is under half of (total - eval) is counted as `implausible_prompt_eval`
and left out of the engine's prompt-eval p50, which is then taken over the plausible
blocks; the (total - eval) figure needs no such care. Pure: text and rows in, numbers out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from anvil_ctl.core.engine_profile import TimingLines
from anvil_ctl.qualify.metrics import percentile

_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?)\s(?P<line>.*)$")


@dataclass(frozen=True)
class PerfBlock:
    """One completion's timing as the engine logged it; `at` is the log line's epoch time."""

    at: float
    prompt_ms: float
    prompt_tokens: int
    eval_ms: float
    eval_tokens: int
    total_ms: float
    total_tokens: int

    @property
    def prompt_tps(self) -> float | None:
        return self.prompt_tokens / self.prompt_ms * 1000 if self.prompt_ms > 0 else None

    @property
    def prefill_tps_from_totals(self) -> float | None:
        before_decode = self.total_ms - self.eval_ms
        return self.prompt_tokens / before_decode * 1000 if before_decode > 0 else None

    @property
    def decode_tps(self) -> float | None:
        return self.eval_tokens / self.eval_ms * 1000 if self.eval_ms > 0 else None

    @property
    def plausible_prompt_eval(self) -> bool:
        """The prompt-eval time accounts for at least half of what came before decoding."""
        return self.prompt_ms >= 0.5 * (self.total_ms - self.eval_ms)


def _epoch(stamp: str) -> float:
    # Docker writes nanoseconds; fromisoformat takes at most microseconds.
    head, _, frac = stamp.rstrip("Z").partition(".")
    text = head + ("." + frac[:6] if frac else "") + "+00:00"
    return datetime.fromisoformat(text).timestamp()


def parse_blocks(log_text: str, timing: TimingLines) -> list[PerfBlock]:
    """Every complete timing block in a timestamped log, in order."""
    patterns = {k: re.compile(getattr(timing, k)) for k in ("prompt_eval", "eval", "total")}
    blocks: list[PerfBlock] = []
    current: dict[str, tuple[float, int]] = {}
    for raw in log_text.splitlines():
        stamped = _TS.match(raw)
        at, line = (_epoch(stamped["ts"]), stamped["line"]) if stamped else (0.0, raw)
        for key, pattern in patterns.items():
            found = pattern.search(line)
            if found is None:
                continue
            current[key] = (float(found["ms"]), int(found["tokens"]))
            if key == "total" and {"prompt_eval", "eval"} <= set(current):
                blocks.append(
                    PerfBlock(
                        at=at,
                        prompt_ms=current["prompt_eval"][0],
                        prompt_tokens=current["prompt_eval"][1],
                        eval_ms=current["eval"][0],
                        eval_tokens=current["eval"][1],
                        total_ms=current["total"][0],
                        total_tokens=current["total"][1],
                    )
                )
                current = {}
            break
    return blocks


@dataclass(frozen=True)
class RowCheck:
    """One measured request beside the engine's block for it."""

    label: str
    gate_prefill_tps: float | None
    gate_decode_tps: float | None
    engine_prompt_tps: float | None
    engine_prefill_tps_from_totals: float | None
    engine_decode_tps: float | None
    plausible_prompt_eval: bool
    prompt_tokens: int | None
    engine_prompt_tokens: int
    engine_eval_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _diff(gate: float | None, engine: float | None) -> float | None:
    """(gate - engine) / engine."""
    if gate is None or engine is None or engine == 0:
        return None
    return round((gate - engine) / engine, 4)


def match_rows(
    rows: Sequence[dict[str, Any]], blocks: Sequence[PerfBlock], slack_s: float = 0.5
) -> list[RowCheck]:
    """Each completed row with the block printed while its request was in flight."""
    out = []
    for row in rows:
        if not row.get("completed") or row.get("started_at") is None:
            continue
        start, end = float(row["started_at"]), float(row["started_at"]) + float(row["e2e_s"])
        inside = [b for b in blocks if start <= b.at <= end + slack_s]
        # A follow-up that counts the prompt evaluates one token (the prefix cache has the rest).
        inside = [b for b in inside if b.prompt_tokens > 1] or inside
        if not inside:
            continue
        block = min(inside, key=lambda b: abs(b.at - end))
        out.append(
            RowCheck(
                label=str(row["label"]),
                gate_prefill_tps=row.get("prefill_tps"),
                gate_decode_tps=row.get("decode_tps"),
                engine_prompt_tps=block.prompt_tps,
                engine_prefill_tps_from_totals=block.prefill_tps_from_totals,
                engine_decode_tps=block.decode_tps,
                plausible_prompt_eval=block.plausible_prompt_eval,
                prompt_tokens=row.get("prompt_tokens"),
                engine_prompt_tokens=block.prompt_tokens,
                engine_eval_tokens=block.eval_tokens,
            )
        )
    return out


def _p50(values: Sequence[float | None]) -> float | None:
    return percentile([v for v in values if v is not None], 50)


def compare(cells: Sequence[dict[str, Any]], blocks: Sequence[PerfBlock]) -> dict[str, Any]:
    """Per capacity cell: the gate's p50 figures beside the engine's, and their differences."""
    report: dict[str, Any] = {"cells": [], "unmatched_rows": 0}
    for cell in cells:
        if cell.get("skipped"):
            continue
        rows = cell.get("rows") or []
        checks = match_rows(rows, blocks)
        report["unmatched_rows"] += sum(1 for r in rows if r.get("completed")) - len(checks)
        gate_prefill = _p50([c.gate_prefill_tps for c in checks])
        gate_decode = _p50([c.gate_decode_tps for c in checks])
        own = _p50([c.engine_prompt_tps for c in checks if c.plausible_prompt_eval])
        totals = _p50([c.engine_prefill_tps_from_totals for c in checks])
        decode = _p50([c.engine_decode_tps for c in checks])
        report["cells"].append(
            {
                "nominal_tokens": cell["nominal_tokens"],
                "concurrency": cell["concurrency"],
                "matched": len(checks),
                "implausible_prompt_eval": sum(1 for c in checks if not c.plausible_prompt_eval),
                "gate_prefill_tps_p50": gate_prefill,
                "engine_prompt_eval_tps_p50": own,
                "engine_prefill_tps_from_totals_p50": totals,
                "gate_decode_tps_p50": gate_decode,
                "engine_eval_tps_p50": decode,
                "prefill_diff_vs_prompt_eval": _diff(gate_prefill, own),
                "prefill_diff_vs_totals": _diff(gate_prefill, totals),
                "decode_diff": _diff(gate_decode, decode),
                "rows": [c.as_dict() for c in checks],
            }
        )
    return report


def worst(report: dict[str, Any], key: str) -> float | None:
    """The largest absolute difference `key` over the report's cells."""
    values = [abs(c[key]) for c in report["cells"] if c.get(key) is not None]
    return max(values) if values else None
