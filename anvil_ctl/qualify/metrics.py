"""Pure capacity arithmetic: per-request rates from stream timing, and percentiles. Prefill
tok/s = prompt_tokens / TTFO; decode tok/s = (completion_tokens - 1) / (e2e - TTFO)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from anvil_ctl.core.jsontypes import JSONMapping, JSONObject, real
from anvil_ctl.qualify.results import ChatResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def request_metrics(result: ChatResult) -> JSONObject:
    """Timing and rates of one streamed request; None where the stream cannot tell."""
    usage = result.usage
    prompt = usage.prompt_tokens if usage else None
    completion = usage.completion_tokens if usage else None
    ttfo = result.ttfo_s
    prefill = prompt / ttfo if prompt and ttfo and ttfo > 0 else None
    decode = None
    if completion is not None and completion > 1 and ttfo is not None and result.e2e_s > ttfo:
        decode = (completion - 1) / (result.e2e_s - ttfo)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "ttft_s": result.ttft_s,
        "ttfo_s": ttfo,
        "e2e_s": result.e2e_s,
        "prefill_tps": prefill,
        "decode_tps": decode,
    }


def summarize(rows: Sequence[JSONMapping], keys: Sequence[str]) -> JSONObject:
    """p50 and p95 of each key over the rows that have it."""
    out: JSONObject = {}
    for key in keys:
        values = [real(r[key]) for r in rows if r.get(key) is not None]
        out[f"{key}_p50"] = percentile(values, 50)
        out[f"{key}_p95"] = percentile(values, 95)
    return out


METRIC_KEYS = ("prompt_tokens", "ttft_s", "ttfo_s", "e2e_s", "prefill_tps", "decode_tps")
