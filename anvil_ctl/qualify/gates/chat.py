"""Chat requests as gates build them, and the checks every reply or tool call must pass.

Shared by the functional gates (`functional.py`, `tools.py`) and the image gates
(`media.py`): one request body per context, the common reply and tool-call checks,
and the evidence a gate of requests records (`finish`).
"""

from __future__ import annotations

from collections.abc import Sequence

from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.qualify.client import EngineClient, Message, tool_arguments
from anvil_ctl.qualify.gates.base import Attempt, Gate, GateContext, stream_problem
from anvil_ctl.qualify.gates.checks import Checks, has_think_markup, same_text
from anvil_ctl.qualify.results import ChatResult, GateResult


def user(text: str) -> Message:
    """A user message of plain text."""
    return {"role": "user", "content": text}


def answered(checks: Checks, label: str, attempt: Attempt) -> ChatResult | None:
    """The attempt's result if it answered and, when streamed, its stream completed.

    Records the `answered` and `stream complete` checks; None when either failed.
    """
    result = attempt.result
    if not checks.add(f"{label}: answered", result is not None, "error", error=attempt.error):
        return None
    assert result is not None
    if result.streamed:
        problem = stream_problem(result)
        if not checks.add(
            f"{label}: stream complete", problem is None, problem or "", errors=list(result.errors)
        ):
            return None
    return result


def check_visible_answer(
    checks: Checks,
    label: str,
    content: str,
    expected: str,
    *,
    check: str = "content",
    observed_chars: int = 500,
    **extra: JSONValue,
) -> None:
    """Visible content is `expected` and carries no think markup."""
    checks.add(
        f"{label}: no think markup",
        not has_think_markup(content),
        "reasoning_leak",
        observed=content[:300],
    )
    checks.add(
        f"{label}: {check}",
        same_text(content, expected),
        "wrong_answer",
        expected=expected,
        observed=content[:observed_chars],
        **extra,
    )


def check_reply(checks: Checks, label: str, attempt: Attempt, expected: str) -> None:
    """The common checks of a request that must answer `expected` in visible content."""
    result = answered(checks, label, attempt)
    if result is None:
        return
    check_visible_answer(checks, label, result.content, expected)
    checks.add(
        f"{label}: usage",
        result.usage is not None and result.usage.completion_tokens > 0,
        "no_usage",
        usage=None if result.usage is None else result.usage.prompt_tokens,
    )


def check_tool_call(checks: Checks, label: str, attempt: Attempt, name: str, arguments: JSONObject) -> None:
    """Exactly one call of `name` whose arguments equal `arguments` as JSON values."""
    result = answered(checks, label, attempt)
    if result is None:
        return
    calls = result.tool_calls
    if not checks.add(
        f"{label}: one tool call",
        len(calls) == 1,
        "no_tool_call",
        observed=[c.name for c in calls],
        content=result.content[:300],
    ):
        return
    observed = tool_arguments(calls[0])
    checks.add(
        f"{label}: exact call",
        calls[0].name == name and observed == arguments,
        "bad_tool_args",
        expected={"name": name, "arguments": arguments},
        observed={"name": calls[0].name, "arguments": calls[0].arguments},
    )
    checks.add(
        f"{label}: finish_reason",
        result.finish_reason == "tool_calls",
        "bad_finish_reason",
        observed=result.finish_reason,
    )


def effective_context(gate_ctx: GateContext, requested: int) -> int:
    """The requested nominal context, clamped to the engine's max_model_len when known."""
    if gate_ctx.max_model_len and requested > gate_ctx.max_model_len:
        return gate_ctx.max_model_len
    return requested


def body(
    gate_ctx: GateContext,
    messages: Sequence[Message],
    max_tokens: int,
    *,
    tools: Sequence[JSONObject] | None = None,
    response_format: JSONObject | None = None,
    stream: bool = False,
) -> JSONObject:
    """A chat request of the served model, with the run's thinking setting."""
    return EngineClient.chat_body(
        gate_ctx.served_model,
        messages,
        max_tokens=max_tokens,
        enable_thinking=gate_ctx.thinking,
        tools=tools,
        response_format=response_format,
        stream=stream,
    )


def finish(gate: Gate, checks: Checks, attempts: list[Attempt], **extra: JSONValue) -> GateResult:
    """The gate's result: its checks, every request, and `extra` evidence."""
    evidence: JSONObject = {"checks": [*checks.items], "requests": [a.as_dict() for a in attempts], **extra}
    summary = "all checks pass" if checks.passed else "failed: " + ", ".join(checks.failed[:5])
    return gate.result(checks.passed, checks.classification, evidence, summary)
