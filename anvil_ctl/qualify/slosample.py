"""One active sample of a serve through the real route, with the official `openai` client.

A sample is a few short streamed chats to the slot's alias with the client key: what a client
of the router meets. Per request: the time to the first token (content or reasoning), the
decode rate after it ((tokens - 1) / (end - first token)), whether it failed (an HTTP error or
a broken connection) and whether its answer ended with a `finish_reason` (a stream that stops
without one was cut). The sample's metrics are those `watchpolicy.METRICS` names. A 401/403
raises `AuthRejected`: a credential problem, never a reason to call the serve unhealthy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import openai

from anvil_ctl.core.errors import AuthRejected
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify.metrics import percentile

PROMPT = "Reply with one short sentence about anvils. (anvil slo sample {n})"


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    decode_tps: float | None = None
    finish_reason: str | None = None
    model: str | None = None
    error: str | None = None

    def as_dict(self) -> JSONObject:
        return {
            "ok": self.ok,
            "ttft_s": _round(self.ttft_s),
            "decode_tps": _round(self.decode_tps),
            "finish_reason": self.finish_reason,
            "model": self.model,
            "error": self.error,
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


@dataclass(frozen=True)
class Sample:
    at: float
    requests: tuple[RequestResult, ...]

    def metrics(self) -> dict[str, float | None]:
        done = [r for r in self.requests if r.ok]
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        decode = [r.decode_tps for r in done if r.decode_tps is not None]
        n = len(self.requests) or 1
        return {
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "decode_tps_p50": percentile(decode, 50),
            "error_rate": sum(not r.ok for r in self.requests) / n,
            "finish_reason_missing": sum(r.ok and not r.finish_reason for r in self.requests) / n,
        }

    def as_dict(self) -> JSONObject:
        metrics: JSONObject = {k: _round(v) for k, v in self.metrics().items()}
        return {"at": round(self.at, 3), "metrics": metrics, "requests": [r.as_dict() for r in self.requests]}


def open_client(router_url: str, client_token: str, *, timeout_s: float = 60.0) -> openai.OpenAI:
    """The official client for the router with the client key; no retries (a retry hides a 500)."""
    return openai.OpenAI(
        base_url=router_url.rstrip("/") + "/v1", api_key=client_token, timeout=timeout_s, max_retries=0
    )


def _one(client: openai.OpenAI, alias: str, n: int, max_tokens: int) -> RequestResult:
    started = time.monotonic()
    first: float | None = None
    last: float | None = None
    tokens, finish, model = 0, None, None
    try:
        stream = client.chat.completions.create(
            model=alias,
            messages=[{"role": "user", "content": PROMPT.format(n=n)}],
            max_tokens=max_tokens,
            stream=True,
        )
        for chunk in stream:
            model = chunk.model or model
            for choice in chunk.choices:
                delta = choice.delta
                text = (delta.content or "") if delta else ""
                reasoning = getattr(delta, "reasoning_content", None) if delta else None
                if text or reasoning:
                    now = time.monotonic()
                    first = now if first is None else first
                    last, tokens = now, tokens + 1
                finish = choice.finish_reason or finish
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise AuthRejected(
            f"router answered {exc.status_code} to the SLO sample: the client token was refused "
            "(not a model failure)",
            status=exc.status_code,
        ) from exc
    except openai.APIStatusError as exc:
        return RequestResult(False, error=f"HTTP {exc.status_code}: {str(exc.message)[:200]}")
    except openai.APIError as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc.message[:200]}")
    ttft = first - started if first is not None else None
    decode = (
        (tokens - 1) / (last - first) if first is not None and last is not None and last > first else None
    )
    return RequestResult(True, ttft, decode, finish, model)


def sample(client: openai.OpenAI, alias: str, *, requests: int, max_tokens: int, clock: float) -> Sample:
    """`requests` streamed chats to `alias`, one after the other."""
    return Sample(clock, tuple(_one(client, alias, n, max_tokens) for n in range(requests)))
