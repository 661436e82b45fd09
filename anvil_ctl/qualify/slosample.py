"""One active sample of a serve through the real route with the official `openai` client: a few
short streamed chats to the slot's alias with the client key, measured as `watchpolicy.METRICS`
names, and when asked the functional gate's own checks (`FUNCTIONAL`). A 401/403 raises
`AuthRejected`: a credential problem, never a reason to call the serve unhealthy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import openai
from openai.types.chat import ChatCompletionMessageParam

from anvil_ctl.core.errors import AuthRejected
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.qualify.results import percentile

PROMPT = "Reply with one short sentence about anvils. (anvil slo sample {n})"
FUNCTIONAL = ("tool_call", "json")
"""The functional gate's checks a sample takes when asked (`sample(functional=n)`)."""


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    decode_tps: float | None = None
    finish_reason: str | None = None
    model: str | None = None
    error: str | None = None

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "ttft_s": _round(self.ttft_s), "decode_tps": _round(self.decode_tps)}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


@dataclass(frozen=True)
class Sample:
    at: float
    requests: tuple[RequestResult, ...]
    functional: tuple[JSONObject, ...] = ()
    """The functional checks taken with the sample (none unless asked for)."""

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
            "functional_failed": float(sum(not c["ok"] for c in self.functional))
            if self.functional
            else None,
        }

    def as_dict(self) -> JSONObject:
        metrics: JSONObject = {k: _round(v) for k, v in self.metrics().items()}
        requests: JSONArray = [r.as_dict() for r in self.requests]
        functional: JSONArray = [*self.functional]
        return {"at": round(self.at, 3), "metrics": metrics, "requests": requests, "functional": functional}


def open_client(router_url: str, client_token: str, *, timeout_s: float = 60.0) -> openai.OpenAI:
    """The official client for the router with the client key; no retries (a retry hides a 500)."""
    return openai.OpenAI(
        base_url=router_url.rstrip("/") + "/v1", api_key=client_token, timeout=timeout_s, max_retries=0
    )


def _refused(exc: openai.AuthenticationError | openai.PermissionDeniedError) -> AuthRejected:
    return AuthRejected(
        f"router answered {exc.status_code} to the SLO sample: the client token was refused "
        "(not a model failure)",
        status=exc.status_code,
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
        raise _refused(exc) from exc
    except openai.APIStatusError as exc:
        return RequestResult(False, error=f"HTTP {exc.status_code}: {str(exc.message)[:200]}")
    except openai.APIError as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc.message[:200]}")
    ttft = first - started if first is not None else None
    decode = (
        (tokens - 1) / (last - first) if first is not None and last is not None and last > first else None
    )
    return RequestResult(True, ttft, decode, finish, model)


def check(client: openai.OpenAI, alias: str, kind: str, n: int) -> JSONObject:
    """Functional check `kind` through the route: the tool-call gate's exact call of fixture
    `n`, or the JSON gate's exact object; judged by the gates' own checkers."""
    from anvil_ctl.qualify import prompts
    from anvil_ctl.qualify.gates.base import Attempt, Checks, check_tool_call
    from anvil_ctl.qualify.gates.functional import JSON_EXPECTED, check_json
    from anvil_ctl.qualify.gates.tools import Tools
    from anvil_ctl.qualify.results import ChatResult, ToolCall

    messages: list[ChatCompletionMessageParam] = []
    extra: JSONObject
    if kind == "tool_call":
        messages.append({"role": "system", "content": prompts.SYSTEM_TOOLS})
        text, extra = prompts.tool_instruction("record_value", Tools.expected(n)), {"tools": [*prompts.TOOLS]}
    else:
        text, extra = prompts.json_instruction(JSON_EXPECTED), {"response_format": {"type": "json_object"}}
    messages.append({"role": "user", "content": text})
    started = time.monotonic()
    try:
        answer = client.chat.completions.create(
            model=alias, messages=messages, max_tokens=256, extra_body=extra
        )
        message, finish = answer.choices[0].message, answer.choices[0].finish_reason
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments)
            for c in message.tool_calls or ()
            if c.type == "function"
        )
        took = time.monotonic() - started
        result = ChatResult(200, message.content or "", "", calls, finish, None, answer.model, False, took)
        attempt = Attempt(kind, result)
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise _refused(exc) from exc
    except openai.APIError as exc:
        attempt = Attempt(kind, None, error=f"{type(exc).__name__}: {exc.message[:200]}")
    checks = Checks()
    if kind == "tool_call":
        check_tool_call(checks, kind, attempt, "record_value", Tools.expected(n))
    else:
        check_json(checks, attempt, JSON_EXPECTED)
    return {
        "check": kind,
        "ok": checks.passed,
        "classification": checks.classification,
        "failed": ", ".join(checks.failed),
    }


def sample(
    client: openai.OpenAI,
    alias: str,
    *,
    requests: int,
    max_tokens: int,
    clock: float,
    functional: int | None = None,
) -> Sample:
    """`requests` streamed chats to `alias`, one after the other; then, with `functional` (the
    sample's number), each functional check."""
    chats = tuple(_one(client, alias, n, max_tokens) for n in range(requests))
    if functional is None:
        return Sample(clock, chats)
    return Sample(clock, chats, tuple(check(client, alias, kind, functional) for kind in FUNCTIONAL))
