"""Functional gates: smoke, JSON, tools (batch, long-context, streaming, continuation),
Responses API and needle. Image and OCR gates live in `media.py`.

Classifications: `pass`, `wrong_answer`, `bad_json`, `bad_tool_args`, `no_tool_call`,
`truncated_stream`, `stream_error`, `wrong_model`, `error`.
"""

from __future__ import annotations

import json
from typing import Any

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import EngineClient, tool_arguments
from anvil_ctl.qualify.gates.base import (
    Attempt,
    Gate,
    GateContext,
    gather_limited,
    prompt_digest,
    stream_problem,
)
from anvil_ctl.qualify.gates.checks import Checks, has_think_markup, parse_json, same_text
from anvil_ctl.qualify.results import ChatResult, GateResult

Message = dict[str, Any]


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def check_reply(checks: Checks, label: str, attempt: Attempt, expected: str) -> None:
    """The common checks of a request that must answer `expected` in visible content."""
    result = attempt.result
    if not checks.add(f"{label}: answered", result is not None, "error", error=attempt.error):
        return
    assert result is not None
    if result.streamed:
        problem = stream_problem(result)
        if not checks.add(
            f"{label}: stream complete", problem is None, problem or "", errors=list(result.errors)
        ):
            return
    checks.add(
        f"{label}: no think markup",
        not has_think_markup(result.content),
        "reasoning_leak",
        observed=result.content[:300],
    )
    checks.add(
        f"{label}: content",
        same_text(result.content, expected),
        "wrong_answer",
        expected=expected,
        observed=result.content[:500],
    )
    checks.add(
        f"{label}: usage",
        result.usage is not None and result.usage.completion_tokens > 0,
        "no_usage",
        usage=None if result.usage is None else result.usage.prompt_tokens,
    )


def check_tool_call(
    checks: Checks, label: str, attempt: Attempt, name: str, arguments: dict[str, Any]
) -> None:
    """Exactly one call of `name` whose arguments equal `arguments` as JSON values."""
    result = attempt.result
    if not checks.add(f"{label}: answered", result is not None, "error", error=attempt.error):
        return
    assert result is not None
    if result.streamed:
        problem = stream_problem(result)
        if not checks.add(
            f"{label}: stream complete", problem is None, problem or "", errors=list(result.errors)
        ):
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


def effective_context(ctx: GateContext, requested: int) -> int:
    """The requested nominal context, clamped to the engine's max_model_len when known."""
    if ctx.max_model_len and requested > ctx.max_model_len:
        return ctx.max_model_len
    return requested


def body(ctx: GateContext, messages: list[Message], max_tokens: int, **kw: Any) -> dict[str, Any]:
    return EngineClient.chat_body(
        ctx.served_model, messages, max_tokens=max_tokens, enable_thinking=ctx.thinking, **kw
    )


def finish(gate: Gate, checks: Checks, attempts: list[Attempt], **extra: Any) -> GateResult:
    evidence = {"checks": checks.items, "requests": [a.as_dict() for a in attempts], **extra}
    summary = "all checks pass" if checks.passed else "failed: " + ", ".join(checks.failed[:5])
    return gate.result(checks.passed, checks.classification, evidence, summary)


class Smoke(Gate):
    """A plain and a streamed request each answer the marker, with usage, from the served model."""

    gate_type = "smoke"

    def __init__(
        self, *, name: str | None = None, marker: str = "ANVIL-SMOKE-OK", max_tokens: int = 256
    ) -> None:
        super().__init__(name=name)
        self.marker = marker
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        checks = Checks()
        messages = [_user(prompts.reply_exactly(self.marker))]
        attempts = [
            await self.attempt(ctx, "plain", body(ctx, messages, self.max_tokens)),
            await self.attempt(ctx, "stream", body(ctx, messages, self.max_tokens, stream=True)),
        ]
        for attempt in attempts:
            check_reply(checks, attempt.label, attempt, self.marker)
            if attempt.result is not None:
                checks.add(
                    f"{attempt.label}: model",
                    attempt.result.model == ctx.served_model,
                    "wrong_model",
                    observed=attempt.result.model,
                )
        return finish(self, checks, attempts)


class JsonOutput(Gate):
    """`response_format` json_object: the content parses and equals the requested JSON."""

    gate_type = "json"

    def __init__(self, *, name: str | None = None, max_tokens: int = 256) -> None:
        super().__init__(name=name)
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        expected = {"status": "ok", "service": "anvil", "items": [3, 1, 2], "ready": True}
        messages = [_user(prompts.json_instruction(expected))]
        attempt = await self.attempt(
            ctx,
            "json",
            body(ctx, messages, self.max_tokens, response_format={"type": "json_object"}),
        )
        checks = Checks()
        if checks.add("answered", attempt.result is not None, "error", error=attempt.error):
            assert attempt.result is not None
            ok, value = parse_json(attempt.result.content)
            if checks.add(
                "parses",
                ok,
                "bad_json",
                observed=attempt.result.content[:500],
                error=None if ok else value,
            ):
                checks.add("equals", value == expected, "wrong_answer", expected=expected, observed=value)
        return finish(self, checks, [attempt])


class Tools(Gate):
    """A shared-prefix batch of `count` tool calls; every one must be exact."""

    gate_type = "tools"

    def __init__(
        self,
        *,
        name: str | None = None,
        count: int = 20,
        concurrency: int = 4,
        prefix_tokens: int = 1024,
        max_tokens: int = 256,
    ) -> None:
        super().__init__(name=name)
        self.count = count
        self.concurrency = concurrency
        self.prefix_tokens = prefix_tokens
        self.max_tokens = max_tokens

    @staticmethod
    def expected(i: int) -> dict[str, Any]:
        return {
            "ledger": f"L-{i:03d}",
            "index": i,
            "amount": round(i * 1.25 + 0.5, 2),
            "tags": [f"t{i}", "anvil"],
        }

    async def run(self, ctx: GateContext) -> GateResult:
        shared = prompts.filler(self.prefix_tokens, chars_per_token=ctx.chars_per_token)
        system = {
            "role": "system",
            "content": prompts.SYSTEM_TOOLS + "\n\nReference notes:\n" + shared,
        }

        def job(i: int) -> Any:
            messages = [system, _user(prompts.tool_instruction("record_value", self.expected(i)))]
            return lambda: self.attempt(
                ctx, f"call-{i}", body(ctx, messages, self.max_tokens, tools=prompts.TOOLS)
            )

        attempts = await gather_limited(self.concurrency, [job(i) for i in range(self.count)])
        checks = Checks()
        exact = 0
        for i, attempt in enumerate(attempts):
            before = len(checks.failed)
            check_tool_call(checks, attempt.label, attempt, "record_value", self.expected(i))
            exact += len(checks.failed) == before
            ctx.on_request(self.name, len(checks.failed) == before, attempt.label)
        result = finish(self, checks, attempts, exact=exact, total=self.count)
        return self.result(
            result.passed, result.classification, result.evidence, f"{exact}/{self.count} exact"
        )


class LongContextTool(Gate):
    """A tool call asked for at the end of a prompt of `context_tokens` nominal tokens."""

    gate_type = "long_context_tool"

    def __init__(self, *, name: str | None = None, context_tokens: int = 8192, max_tokens: int = 256) -> None:
        super().__init__(name=name)
        self.context_tokens = context_tokens
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        args = {"order_id": "LC-90210", "include_items": True}
        nominal = effective_context(ctx, self.context_tokens)
        text = prompts.context_prompt(
            nominal,
            prompts.tool_instruction("lookup_order", args),
            reserve_tokens=self.max_tokens + 512,
            chars_per_token=ctx.chars_per_token,
        )
        messages = [{"role": "system", "content": prompts.SYSTEM_TOOLS}, _user(text)]
        attempt = await self.attempt(
            ctx, "long-tool", body(ctx, messages, self.max_tokens, tools=prompts.TOOLS)
        )
        checks = Checks()
        check_tool_call(checks, "long-tool", attempt, "lookup_order", args)
        measured = attempt.result.usage.prompt_tokens if attempt.result and attempt.result.usage else None
        return finish(
            self,
            checks,
            [attempt],
            nominal_tokens=nominal,
            requested_tokens=self.context_tokens,
            measured_prompt_tokens=measured,
            prompt=prompt_digest(text),
        )


class StreamingTool(Gate):
    """A streamed tool call, assembled from deltas by index, complete and exact."""

    gate_type = "streaming_tool"

    def __init__(self, *, name: str | None = None, max_tokens: int = 256) -> None:
        super().__init__(name=name)
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        args = {"ledger": "STREAM-7", "index": 7, "amount": 19.5, "tags": ["stream", "delta"]}
        messages = [
            {"role": "system", "content": prompts.SYSTEM_TOOLS},
            _user(prompts.tool_instruction("record_value", args)),
        ]
        attempt = await self.attempt(
            ctx,
            "stream-tool",
            body(ctx, messages, self.max_tokens, tools=prompts.TOOLS, stream=True),
        )
        checks = Checks()
        check_tool_call(checks, "stream-tool", attempt, "record_value", args)
        return finish(self, checks, [attempt])


class ToolResultContinuation(Gate):
    """After a tool result, the model answers in text, carrying the tool's content."""

    gate_type = "tool_result"

    def __init__(self, *, name: str | None = None, max_tokens: int = 256) -> None:
        super().__init__(name=name)
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        args = {"order_id": "A-1042", "include_items": False}
        tool_content = "ORDER A-1042 SHIPPED 3 ITEMS"
        messages: list[Message] = [
            {"role": "system", "content": prompts.SYSTEM_TOOLS},
            _user(prompts.tool_instruction("lookup_order", args)),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_anvil_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": json.dumps(args)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_anvil_1", "content": tool_content},
        ]
        attempt = await self.attempt(
            ctx, "continuation", body(ctx, messages, self.max_tokens, tools=prompts.TOOLS)
        )
        checks = Checks()
        result = attempt.result
        if checks.add("answered", result is not None, "error", error=attempt.error):
            assert result is not None
            checks.add(
                "no further tool call",
                not result.tool_calls,
                "unexpected_tool_call",
                observed=[c.name for c in result.tool_calls],
            )
            checks.add(
                "carries the tool result",
                tool_content.casefold() in result.content.casefold(),
                "wrong_answer",
                expected=tool_content,
                observed=result.content[:500],
            )
        return finish(self, checks, [attempt])


class ResponsesApi(Gate):
    """POST /v1/responses answers the marker as output text."""

    gate_type = "responses"

    def __init__(
        self,
        *,
        name: str | None = None,
        marker: str = "ANVIL-RESPONSES-OK",
        max_output_tokens: int = 256,
    ) -> None:
        super().__init__(name=name)
        self.marker = marker
        self.max_output_tokens = max_output_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        checks = Checks()
        try:
            answer = await ctx.client.responses(
                ctx.served_model,
                prompts.reply_exactly(self.marker),
                max_output_tokens=self.max_output_tokens,
                enable_thinking=ctx.thinking,
            )
        except AnvilError as exc:
            checks.add("answered", False, "error", error=str(exc))
            return self.result(False, "error", {"checks": checks.items}, str(exc))
        checks.add(
            "output text",
            same_text(answer.text, self.marker),
            "wrong_answer",
            expected=self.marker,
            observed=answer.text[:500],
        )
        checks.add(
            "status",
            answer.response_status in (None, "completed"),
            "incomplete",
            observed=answer.response_status,
        )
        return self.result(
            checks.passed,
            checks.classification,
            {"checks": checks.items, "response": answer.as_dict()},
            "all checks pass" if checks.passed else ", ".join(checks.failed),
        )


class Needle(Gate):
    """A needle sentence at `depth` of a `context_tokens` prompt is found and returned."""

    gate_type = "needle"

    def __init__(
        self,
        *,
        name: str | None = None,
        context_tokens: int = 8192,
        depth: float = 0.5,
        needle: str = "MAGENTA-7741",
        max_tokens: int = 128,
    ) -> None:
        super().__init__(name=name)
        self.context_tokens = context_tokens
        self.depth = depth
        self.needle = needle
        self.max_tokens = max_tokens

    async def run(self, ctx: GateContext) -> GateResult:
        nominal = effective_context(ctx, self.context_tokens)
        text = prompts.context_prompt(
            nominal,
            "What is the needle? Answer with its value only.",
            reserve_tokens=self.max_tokens + 512,
            chars_per_token=ctx.chars_per_token,
            needle=self.needle,
            needle_depth=self.depth,
        )
        attempt = await self.attempt(ctx, "needle", body(ctx, [_user(text)], self.max_tokens))
        checks = Checks()
        result: ChatResult | None = attempt.result
        if checks.add("answered", result is not None, "error", error=attempt.error):
            assert result is not None
            checks.add(
                "needle found",
                self.needle in result.content,
                "wrong_answer",
                expected=self.needle,
                observed=result.content[:300],
            )
        measured = result.usage.prompt_tokens if result and result.usage else None
        return finish(
            self,
            checks,
            [attempt],
            nominal_tokens=nominal,
            requested_tokens=self.context_tokens,
            measured_prompt_tokens=measured,
            prompt=prompt_digest(text),
        )
