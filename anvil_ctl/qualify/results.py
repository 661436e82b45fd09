"""Value types of qualification, what one request observed and what one gate concluded, and their
pure capacity arithmetic: per-request rates from stream timing (prefill tok/s = prompt_tokens /
TTFO; decode tok/s = (completion_tokens - 1) / (e2e - TTFO)) and percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from anvil_ctl.core.jsontypes import JSONMapping, JSONObject, real, whole

GateKind = Literal["functional", "policy"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    reasoning_tokens: int | None = None

    @classmethod
    def from_dict(cls, data: JSONMapping) -> Usage:
        details = data.get("completion_tokens_details") or data.get("output_tokens_details") or {}
        prompt = whole(data.get("prompt_tokens", data.get("input_tokens", 0)) or 0)
        completion = whole(data.get("completion_tokens", data.get("output_tokens", 0)) or 0)
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=whole(data.get("total_tokens", prompt + completion) or 0),
            reasoning_tokens=whole(reasoning) if reasoning is not None else None,
        )


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatResult:
    """One chat completion as observed. Times are seconds from sending: `ttft_s` the first visible
    content, `ttfo_s` the first output of any kind; both None for a non-streamed request."""

    status: int
    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str | None
    streamed: bool
    e2e_s: float
    done: bool = True
    truncated: bool = False
    errors: tuple[str, ...] = ()
    ttft_s: float | None = None
    ttfo_s: float | None = None
    chunks: int = 0
    output_chunks: int = 0
    """Chunks that carried output (content, reasoning or a tool-call delta); an engine that
    streams one token per chunk and reports no usage is counted by them."""

    def as_dict(self) -> JSONObject:
        data = asdict(self)
        data["tool_calls"] = [asdict(c) for c in self.tool_calls]
        data["errors"] = list(self.errors)
        return data


@dataclass(frozen=True)
class ResponsesResult:
    """One Responses API answer: its output text, item types, status and usage."""

    status: int
    text: str
    output_types: tuple[str, ...]
    response_status: str | None
    usage: Usage | None
    model: str | None
    e2e_s: float

    def as_dict(self) -> JSONObject:
        data = asdict(self)
        data["output_types"] = list(self.output_types)
        return data


@dataclass(frozen=True)
class GateResult:
    """What one gate concluded, with the evidence an outsider needs to check it; `classification`
    is a short machine word (`pass`, `wrong_answer`, ...; each gate's docstring lists its own)."""

    name: str
    passed: bool
    kind: GateKind
    classification: str
    evidence: JSONObject = field(default_factory=dict)
    summary: str = ""
    duration_s: float = 0.0


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
