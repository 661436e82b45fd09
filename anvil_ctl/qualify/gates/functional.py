"""Functional gates: smoke, JSON output, Responses API and needle.

Tool-calling gates live in `tools.py`, image and OCR gates in `media.py`; the request
and reply checks they share in `chat.py` (re-exported here, where they used to live).

Classifications: `pass`, `wrong_answer`, `bad_json`, `reasoning_leak`, `no_usage`,
`truncated_stream`, `stream_error`, `wrong_model`, `incomplete`, `error`.
"""

from __future__ import annotations

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.gates.base import Gate, GateContext, prompt_digest
from anvil_ctl.qualify.gates.chat import (
    body,
    check_reply,
    check_tool_call,
    effective_context,
    finish,
    user,
)
from anvil_ctl.qualify.gates.checks import Checks, parse_json, same_text
from anvil_ctl.qualify.gates.tools import LongContextTool, StreamingTool, ToolResultContinuation, Tools
from anvil_ctl.qualify.results import ChatResult, GateResult

__all__ = [
    "JsonOutput",
    "LongContextTool",
    "Needle",
    "ResponsesApi",
    "Smoke",
    "StreamingTool",
    "ToolResultContinuation",
    "Tools",
    "body",
    "check_reply",
    "check_tool_call",
    "effective_context",
    "finish",
]


class Smoke(Gate):
    """A plain and a streamed request each answer the marker, with usage, from the served model."""

    gate_type = "smoke"

    def __init__(
        self, *, name: str | None = None, marker: str = "ANVIL-SMOKE-OK", max_tokens: int = 256
    ) -> None:
        super().__init__(name=name)
        self.marker = marker
        self.max_tokens = max_tokens

    async def run(self, gate_ctx: GateContext) -> GateResult:
        checks = Checks()
        messages = [user(prompts.reply_exactly(self.marker))]
        attempts = [
            await self.attempt(gate_ctx, "plain", body(gate_ctx, messages, self.max_tokens)),
            await self.attempt(gate_ctx, "stream", body(gate_ctx, messages, self.max_tokens, stream=True)),
        ]
        for attempt in attempts:
            check_reply(checks, attempt.label, attempt, self.marker)
            if attempt.result is not None:
                checks.add(
                    f"{attempt.label}: model",
                    attempt.result.model == gate_ctx.served_model,
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

    async def run(self, gate_ctx: GateContext) -> GateResult:
        expected: JSONObject = {"status": "ok", "service": "anvil", "items": [3, 1, 2], "ready": True}
        messages = [user(prompts.json_instruction(expected))]
        attempt = await self.attempt(
            gate_ctx,
            "json",
            body(gate_ctx, messages, self.max_tokens, response_format={"type": "json_object"}),
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

    async def run(self, gate_ctx: GateContext) -> GateResult:
        checks = Checks()
        try:
            answer = await gate_ctx.client.responses(
                gate_ctx.served_model,
                prompts.reply_exactly(self.marker),
                max_output_tokens=self.max_output_tokens,
                enable_thinking=gate_ctx.thinking,
            )
        except AnvilError as exc:
            checks.add("answered", False, "error", error=str(exc))
            return self.result(False, "error", {"checks": [*checks.items]}, str(exc))
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
            {"checks": [*checks.items], "response": answer.as_dict()},
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

    async def run(self, gate_ctx: GateContext) -> GateResult:
        nominal = effective_context(gate_ctx, self.context_tokens)
        text = prompts.context_prompt(
            nominal,
            "What is the needle? Answer with its value only.",
            reserve_tokens=self.max_tokens + 512,
            chars_per_token=gate_ctx.chars_per_token,
            needle=self.needle,
            needle_depth=self.depth,
        )
        attempt = await self.attempt(gate_ctx, "needle", body(gate_ctx, [user(text)], self.max_tokens))
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
