"""Workload gates: capacity at nominal contexts and concurrencies, and endurance. Requests are
streamed with usage (timing from the stream, prompt size from the engine). Classifications:
`pass`, `incomplete`, `below_threshold`."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONArray, JSONObject, get_array, get_float, get_int
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import Attempt, Gate, GateContext, gather_limited, stream_problem
from anvil_ctl.qualify.results import METRIC_KEYS, GateResult, request_metrics, summarize

CONTINUE = "Continue the numbered notes above in the same style, one sentence per note."
SALT_TOKENS = 24
"""Budget of the salt's system message (its text and the template's role markers)."""


@dataclass(frozen=True)
class Repetition:
    """The rows of one repetition of a capacity cell and its aggregate output rate."""

    rows: list[JSONObject]
    aggregate_tps: float
    prompt: JSONObject


def _failure(attempt: Attempt) -> str | None:
    """Why a workload request does not count as completed, or None."""
    result = attempt.result
    if result is None:
        return attempt.error_kind or "error"
    problem = stream_problem(result)
    if problem:
        return problem
    if result.usage is None:
        return "no_usage"
    if result.usage.completion_tokens < 1:
        return "empty"
    if result.finish_reason not in ("stop", "length"):
        return f"finish_reason_{result.finish_reason}"
    return None


class _Workload(Gate):
    output_tokens: int
    ignore_eos: bool
    thinking: bool | None

    async def _fit(self, gate_ctx: GateContext, nominal: int) -> float:
        """Characters per token for a prompt of this nominal size, by the engine's own count
        where it has a tokenize endpoint (long filler has longer numbers: the ratio drifts)."""
        tokenizer = gate_ctx.engine.tokenizer
        if tokenizer is None:
            return gate_ctx.chars_per_token
        text = self._text(nominal, gate_ctx.chars_per_token)
        try:
            counted = await gate_ctx.client.tokenize_count(tokenizer, text, gate_ctx.served_model)
        except AnvilError:
            return gate_ctx.chars_per_token
        return len(text) / counted if counted > 0 else gate_ctx.chars_per_token

    def _text(self, nominal: int, chars_per_token: float) -> str:
        return prompts.context_prompt(
            nominal,
            CONTINUE,
            reserve_tokens=self.output_tokens + 64 + SALT_TOKENS,
            chars_per_token=chars_per_token,
        )

    def _request(
        self, gate_ctx: GateContext, nominal: int, salt: str, chars_per_token: float
    ) -> tuple[JSONObject, str]:
        # The salt opens the prompt, in a system message of its own: an engine's prefix cache
        # then reuses only a few template tokens from the previous request, so the prefill
        # measured is the whole prompt's, whatever the chat template puts first.
        text = self._text(nominal, chars_per_token)
        thinking = gate_ctx.thinking if self.thinking is None else self.thinking
        request = EngineClient.chat_body(
            gate_ctx.served_model,
            [{"role": "system", "content": f"Request {salt}."}, {"role": "user", "content": text}],
            max_tokens=self.output_tokens,
            enable_thinking=thinking,
            stream=True,
            extra={"ignore_eos": True} if self.ignore_eos else None,
        )
        return request, text

    async def _batch(
        self, gate_ctx: GateContext, nominal: int, labels: list[str], concurrency: int, chars_per_token: float
    ) -> tuple[list[JSONObject], float, str]:
        """One request per label, at most `concurrency` at once: their rows, the wall time, the last
        prompt."""
        text, jobs = "", []
        for label in labels:
            request, text = self._request(gate_ctx, nominal, f"{self.name} {label}", chars_per_token)
            jobs.append(functools.partial(self._measure, gate_ctx, label, request))
        started = time.perf_counter()
        rows = await gather_limited(concurrency, jobs)
        return rows, time.perf_counter() - started, text

    async def _measure(self, gate_ctx: GateContext, label: str, request: JSONObject) -> JSONObject:
        # Wall-clock start: lets the engine's own log lines of this request be found by time.
        started_at = round(time.time(), 3)
        attempt = await self.attempt(gate_ctx, label, request)
        failure = _failure(attempt)
        row: JSONObject = {
            "label": label,
            "completed": failure is None,
            "failure": failure,
            "started_at": started_at,
        }
        if attempt.result is not None:
            row.update(request_metrics(attempt.result))
            row["finish_reason"] = attempt.result.finish_reason
        if attempt.usage_counted is not None:
            row["usage_counted"] = attempt.usage_counted
        if failure is not None:
            # Keep everything about a failed request; a completed one keeps its numbers.
            row["attempt"] = attempt.as_dict()
        gate_ctx.on_request(self.name, failure is None, f"{label}: {failure or 'ok'}")
        return row


@dataclass(kw_only=True, eq=False)
class Capacity(_Workload):
    """Requests at each nominal context and concurrency; all complete, thresholds met."""

    gate_type = "capacity"

    contexts: list[int] = field(default_factory=lambda: [4096])
    concurrency: list[int] = field(default_factory=lambda: [1])
    repetitions: int = 3
    output_tokens: int = 256
    thinking: bool | None = None
    ignore_eos: bool = False
    skip_above_max_model_len: bool = True
    min_decode_tps: float | None = None
    min_prefill_tps: float | None = None
    max_ttft_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.contexts = self.contexts or [4096]
        self.concurrency = self.concurrency or [1]

    async def run(self, gate_ctx: GateContext) -> GateResult:
        cells: list[JSONObject] = []
        labels: list[str] = []
        for nominal in self.contexts:
            for conc in self.concurrency:
                cell = self.skipped(nominal, conc, gate_ctx.max_model_len)
                if cell is None:
                    fit = await self._fit(gate_ctx, nominal)
                    reps = [
                        await self.repetition(gate_ctx, nominal, conc, r, fit)
                        for r in range(self.repetitions)
                    ]
                    cell = self.cell(nominal, conc, reps)
                cells.append(cell)
                done = "skipped" if cell.get("skipped") else f"{cell['completed']}/{cell['requests']}"
                labels.append(f"{context_label(nominal)}/C{conc} {done}")
        problems = [p for cell in cells for p in get_array(cell, "problems")]
        incomplete = any(cell.get("failed") for cell in cells)
        measured = [c for c in cells if not c.get("skipped")]
        passed = bool(measured) and not incomplete and not problems
        classification = "incomplete" if incomplete else "below_threshold" if problems else "pass"
        if not measured:
            classification = "nothing_measured"
        summary = "; ".join(labels)
        evidence: JSONObject = {"cells": [*cells], "problems": problems}
        return self.result(passed, classification, evidence, summary)

    def skipped(self, nominal: int, conc: int, *limits: int | None) -> JSONObject | None:
        """The cell recorded instead of a measurement when `nominal` is above a known max_model_len."""
        if self.skip_above_max_model_len and any(lim and nominal > lim for lim in limits):
            return {"nominal_tokens": nominal, "concurrency": conc, "skipped": "above max_model_len"}
        return None

    async def repetition(
        self, gate_ctx: GateContext, nominal: int, conc: int, rep: int, chars_per_token: float | None = None
    ) -> Repetition:
        """One repetition of a cell: `conc` requests at once (an A/B interleaves these).

        `chars_per_token`: the prompt sizing fitted for this nominal size (None: fit it now)."""
        if chars_per_token is None:
            chars_per_token = await self._fit(gate_ctx, nominal)
        labels = [f"{context_label(nominal)}-C{conc}-r{rep + 1}-{lane + 1}" for lane in range(conc)]
        batch, wall, text = await self._batch(gate_ctx, nominal, labels, conc, chars_per_token)
        prompt_info: JSONObject = {"chars": len(text), "tail": text[-120:]} if labels else {}
        tokens = sum(get_int(r, "completion_tokens") or 0 for r in batch if r["completed"])
        return Repetition(batch, tokens / wall if wall > 0 else 0.0, prompt_info)

    def cell(self, nominal: int, conc: int, reps: list[Repetition]) -> JSONObject:
        """A cell's evidence from its repetitions: every row, the p50/p95 and threshold problems."""
        rows: JSONArray = [row for rep in reps for row in rep.rows]
        aggregate = [rep.aggregate_tps for rep in reps]
        prompt_info = reps[-1].prompt if reps else {}
        done = [row for rep in reps for row in rep.rows if row["completed"]]
        cell: JSONObject = {
            "nominal_tokens": nominal,
            "concurrency": conc,
            "requests": len(rows),
            "completed": len(done),
            "failed": len(rows) - len(done),
            "prompt": prompt_info,
            **summarize(done, METRIC_KEYS),
            "aggregate_output_tps_p50": sorted(aggregate)[len(aggregate) // 2] if aggregate else None,
            "rows": rows,
        }
        cell["problems"] = [*self._threshold_problems(cell, f"{context_label(nominal)}/C{conc}")]
        return cell

    def _threshold_problems(self, cell: JSONObject, where: str) -> list[str]:
        found = []
        for what, key, op, limit in (
            ("decode", "decode_tps_p50", "<", self.min_decode_tps),
            ("prefill", "prefill_tps_p50", "<", self.min_prefill_tps),
            ("TTFT", "ttft_s_p50", ">", self.max_ttft_s),
        ):
            value = get_float(cell, key)
            if limit is not None and (value is None or (value < limit if op == "<" else value > limit)):
                found.append(f"{where}: {what} p50 {value} {op} {limit}")
        return found


@dataclass(kw_only=True, eq=False)
class Endurance(_Workload):
    """`requests` requests at `concurrency`; at most `max_failures` fail, every failure kept."""

    gate_type = "endurance"

    requests: int = 60
    concurrency: int = 1
    context_tokens: int = 4096
    output_tokens: int = 128
    thinking: bool | None = None
    ignore_eos: bool = False
    max_failures: int = 0

    async def run(self, gate_ctx: GateContext) -> GateResult:
        chars_per_token = await self._fit(gate_ctx, self.context_tokens)
        labels = [f"endurance-{i + 1}" for i in range(self.requests)]
        rows, wall, _ = await self._batch(
            gate_ctx, self.context_tokens, labels, self.concurrency, chars_per_token
        )
        done = [r for r in rows if r["completed"]]
        failures: JSONArray = [r for r in rows if not r["completed"]]
        passed = len(failures) <= self.max_failures and bool(rows)
        evidence: JSONObject = {
            "nominal_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "requests": len(rows),
            "completed": len(done),
            "failed": len(failures),
            "failures": failures,
            "wall_s": wall,
            **summarize(done, METRIC_KEYS),
            "rows": [{k: v for k, v in r.items() if k != "attempt"} for r in rows],
        }
        return self.result(passed, "incomplete", evidence, f"{len(done)}/{len(rows)} completed")
