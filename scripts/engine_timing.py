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
- decode, like with like: the gate's `decode_tps` is what a client sees between its first
  and last token, so it holds each decode step (`eval`, `llama_decode` alone) *and* the
  server's per-token work (sampling, detokenizing, one SSE chunk through its event loop),
  which grows with CPU contention. The engine's eval rate is the ceiling of that figure;
  its floor is the engine's decode phase, eval steps over everything after prompt eval
  (total - prompt eval: every step and all the per-token work, plus the little one-time
  work around the first token). The gate's decode is judged against that window, each
  end with the tolerance, request by request against its own block (`decode_within_engine`:
  all of a cell's requests with a plausible block); the engine-reported share of non-eval
  time in its decode phase (`engine_decode_overhead`) says how wide the window is, and the
  paired difference to each end is reported.

llama.cpp's prompt-eval time is sometimes implausible: a fraction of a millisecond for
hundreds of tokens while (total - eval) is seconds (docs/ENGINES.md). A block whose
prompt-eval time is under half of (total - eval) is counted as `implausible_prompt_eval`
and left out of the engine's prompt-eval p50 and of the decode phase (its prompt time is
unknown there), which are then taken over the plausible blocks; the (total - eval)
figure needs no such care. Pure: text and rows in, numbers out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from anvil_ctl.core.engine_profile import TimingLines
from anvil_ctl.core.jsontypes import JSONArray, JSONMapping, JSONObject, JSONValue
from anvil_ctl.qualify.results import percentile

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
    def decode_phase_tps(self) -> float | None:
        """Decode steps over everything after prompt eval: the floor of a client's decode rate."""
        after_prompt = self.total_ms - self.prompt_ms
        return self.eval_tokens / after_prompt * 1000 if after_prompt > 0 else None

    @property
    def decode_overhead(self) -> float | None:
        """The share of the decode phase that is not eval: the server's per-token work."""
        after_prompt = self.total_ms - self.prompt_ms
        return (after_prompt - self.eval_ms) / after_prompt if after_prompt > 0 else None

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
    engine_decode_phase_tps: float | None
    engine_decode_overhead: float | None
    plausible_prompt_eval: bool
    prompt_tokens: int | None
    engine_prompt_tokens: int
    engine_eval_tokens: int

    def as_dict(self) -> JSONObject:
        data: dict[str, JSONValue] = asdict(self)
        return data


def _diff(gate: float | None, engine: float | None) -> float | None:
    """(gate - engine) / engine."""
    if gate is None or engine is None or engine == 0:
        return None
    return round((gate - engine) / engine, 4)


def _number(row: JSONMapping, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(row: JSONMapping, key: str) -> int | None:
    value = _number(row, key)
    return None if value is None else int(value)


def match_rows(
    rows: Sequence[JSONMapping], blocks: Sequence[PerfBlock], slack_s: float = 0.5
) -> list[RowCheck]:
    """Each completed row with the block printed while its request was in flight."""
    out = []
    for row in rows:
        started, e2e = _number(row, "started_at"), _number(row, "e2e_s")
        if not row.get("completed") or started is None or e2e is None:
            continue
        start, end = started, started + e2e
        inside = [b for b in blocks if start <= b.at <= end + slack_s]
        # A follow-up that counts the prompt evaluates one token (the prefix cache has the rest).
        inside = [b for b in inside if b.prompt_tokens > 1] or inside
        if not inside:
            continue
        block = min(inside, key=lambda b: abs(b.at - end))
        prompt_tokens = _number(row, "prompt_tokens")
        out.append(
            RowCheck(
                label=str(row.get("label")),
                gate_prefill_tps=_number(row, "prefill_tps"),
                gate_decode_tps=_number(row, "decode_tps"),
                engine_prompt_tps=block.prompt_tps,
                engine_prefill_tps_from_totals=block.prefill_tps_from_totals,
                engine_decode_tps=block.decode_tps,
                engine_decode_phase_tps=block.decode_phase_tps,
                engine_decode_overhead=block.decode_overhead,
                plausible_prompt_eval=block.plausible_prompt_eval,
                prompt_tokens=None if prompt_tokens is None else int(prompt_tokens),
                engine_prompt_tokens=block.prompt_tokens,
                engine_eval_tokens=block.eval_tokens,
            )
        )
    return out


def _p50(values: Sequence[float | None]) -> float | None:
    return percentile([v for v in values if v is not None], 50)


DECODE_TOLERANCE = 0.10
"""How far outside the engine's own decode window (its eval rate above, its decode phase
below) the gate's decode rate may lie: jitter of a loaded machine, not a fudge for the
server's per-token work, which the window itself holds."""


def _row_within(c: RowCheck, tolerance: float) -> bool | None:
    """One request's decode against its own block's window; None where it cannot be told."""
    gate, floor, ceiling = c.gate_decode_tps, c.engine_decode_phase_tps, c.engine_decode_tps
    if gate is None or floor is None or ceiling is None:
        return None
    return floor * (1 - tolerance) <= gate <= ceiling * (1 + tolerance)


def _decode_window(checks: Sequence[RowCheck], tolerance: float) -> JSONObject:
    """Each request's decode against the window of its own block, [decode phase, eval] +-
    tolerance, paired: the p50s of a cell are taken over the same requests (the plausible
    ones; a p50 over other requests than the gate's is not like with like)."""
    plausible = [c for c in checks if c.plausible_prompt_eval]
    # Without a plausible prompt-eval line, all blocks: the floor only gets lower (still true).
    basis = plausible or list(checks)
    verdicts = [_row_within(c, tolerance) for c in basis]
    within = bool(verdicts) and all(v is True for v in verdicts)
    return {
        "decode_rows_judged": len(basis),
        "gate_decode_tps_p50_judged": _p50([c.gate_decode_tps for c in basis]),
        "engine_decode_phase_tps_p50": _p50([c.engine_decode_phase_tps for c in basis]),
        "engine_eval_tps_p50_judged": _p50([c.engine_decode_tps for c in basis]),
        "engine_decode_overhead_p50": _rounded(_p50([c.engine_decode_overhead for c in basis])),
        "decode_phase_from": "plausible blocks" if plausible else "all blocks (no plausible prompt eval)",
        "decode_diff_vs_decode_phase": _rounded(
            _p50([_diff(c.gate_decode_tps, c.engine_decode_phase_tps) for c in basis])
        ),
        "decode_diff_vs_eval_paired": _rounded(
            _p50([_diff(c.gate_decode_tps, c.engine_decode_tps) for c in basis])
        ),
        "decode_within_engine": within,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def compare(
    cells: Sequence[JSONMapping], blocks: Sequence[PerfBlock], *, tolerance: float = DECODE_TOLERANCE
) -> JSONObject:
    """Per capacity cell: the gate's p50 figures beside the engine's, and their differences."""
    out: JSONArray = []
    unmatched = 0
    for cell in cells:
        if cell.get("skipped"):
            continue
        raw = cell.get("rows")
        rows = [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
        checks = match_rows(rows, blocks)
        unmatched += sum(1 for r in rows if r.get("completed")) - len(checks)
        gate_prefill = _p50([c.gate_prefill_tps for c in checks])
        gate_decode = _p50([c.gate_decode_tps for c in checks])
        own = _p50([c.engine_prompt_tps for c in checks if c.plausible_prompt_eval])
        totals = _p50([c.engine_prefill_tps_from_totals for c in checks])
        decode = _p50([c.engine_decode_tps for c in checks])
        out.append(
            {
                "nominal_tokens": _count(cell, "nominal_tokens"),
                "concurrency": _count(cell, "concurrency"),
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
                **_decode_window(checks, tolerance),
                "rows": [c.as_dict() for c in checks],
            }
        )
    return {"cells": out, "unmatched_rows": unmatched, "decode_tolerance": tolerance}


def report_cells(report: JSONMapping) -> list[JSONMapping]:
    """The report's cells (as `compare` wrote them)."""
    cells = report.get("cells")
    return [c for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []


def worst(report: JSONMapping, key: str) -> float | None:
    """The largest absolute difference `key` over the report's cells."""
    values = [abs(v) for c in report_cells(report) if (v := _number(c, key)) is not None]
    return max(values) if values else None
