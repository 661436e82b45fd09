"""Tool-calling gates: a batch of exact calls, a call at long context, a streamed call,
and the answer after a tool result.

Classifications: `pass`, `bad_tool_args`, `no_tool_call`, `bad_finish_reason`,
`unexpected_tool_call`, `wrong_answer`, `truncated_stream`, `stream_error`, `error`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import Message
from anvil_ctl.qualify.gates.base import (
    Checks,
    Gate,
    GateContext,
    answered,
    check_tool_call,
    effective_context,
    finish,
    gather_limited,
    long_prompt,
    user,
)
from anvil_ctl.qualify.results import GateResult


@dataclass(kw_only=True, eq=False)
class Tools(Gate):
    """A shared-prefix batch of `count` tool calls; every one must be exact."""

    gate_type = "tools"

    count: int = 20
    concurrency: int = 4
    prefix_tokens: int = 1024
    max_tokens: int = 256

    @staticmethod
    def expected(i: int) -> JSONObject:
        return {
            "ledger": f"L-{i:03d}",
            "index": i,
            "amount": round(i * 1.25 + 0.5, 2),
            "tags": [f"t{i}", "anvil"],
        }

    async def run(self, gate_ctx: GateContext) -> GateResult:
        shared = prompts.filler(self.prefix_tokens, chars_per_token=gate_ctx.chars_per_token)
        system: Message = {
            "role": "system",
            "content": prompts.SYSTEM_TOOLS + "\n\nReference notes:\n" + shared,
        }

        jobs = [
            functools.partial(
                self.ask,
                gate_ctx,
                f"call-{i}",
                [system, user(prompts.tool_instruction("record_value", self.expected(i)))],
                self.max_tokens,
                tools=prompts.TOOLS,
            )
            for i in range(self.count)
        ]
        attempts = await gather_limited(self.concurrency, jobs)
        checks = Checks()
        exact = 0
        for i, attempt in enumerate(attempts):
            before = len(checks.failed)
            check_tool_call(checks, attempt.label, attempt, "record_value", self.expected(i))
            exact += len(checks.failed) == before
            gate_ctx.on_request(self.name, len(checks.failed) == before, attempt.label)
        return finish(
            self, checks, attempts, f"{exact}/{self.count} exact", {"exact": exact, "total": self.count}
        )


@dataclass(kw_only=True, eq=False)
class LongContextTool(Gate):
    """A tool call asked for at the end of a prompt of `context_tokens` nominal tokens."""

    gate_type = "long_context_tool"

    context_tokens: int = 8192
    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        args: JSONObject = {"order_id": "LC-90210", "include_items": True}
        nominal = effective_context(gate_ctx, self.context_tokens)
        text = prompts.context_prompt(
            nominal,
            prompts.tool_instruction("lookup_order", args),
            reserve_tokens=self.max_tokens + 512,
            chars_per_token=gate_ctx.chars_per_token,
        )
        messages: list[Message] = [{"role": "system", "content": prompts.SYSTEM_TOOLS}, user(text)]
        attempt = await self.ask(gate_ctx, "long-tool", messages, self.max_tokens, tools=prompts.TOOLS)
        checks = Checks()
        check_tool_call(checks, "long-tool", attempt, "lookup_order", args)
        return finish(self, checks, [attempt], extra=long_prompt(nominal, self.context_tokens, text, attempt))


@dataclass(kw_only=True, eq=False)
class StreamingTool(Gate):
    """A streamed tool call, assembled from deltas by index, complete and exact."""

    gate_type = "streaming_tool"

    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        args: JSONObject = {"ledger": "STREAM-7", "index": 7, "amount": 19.5, "tags": ["stream", "delta"]}
        messages: list[Message] = [
            {"role": "system", "content": prompts.SYSTEM_TOOLS},
            user(prompts.tool_instruction("record_value", args)),
        ]
        attempt = await self.ask(
            gate_ctx, "stream-tool", messages, self.max_tokens, tools=prompts.TOOLS, stream=True
        )
        checks = Checks()
        check_tool_call(checks, "stream-tool", attempt, "record_value", args)
        return finish(self, checks, [attempt])


@dataclass(kw_only=True, eq=False)
class ToolResultContinuation(Gate):
    """After a tool result, the model answers in text, carrying the tool's content."""

    gate_type = "tool_result"

    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        args: JSONObject = {"order_id": "A-1042", "include_items": False}
        tool_content = "ORDER A-1042 SHIPPED 3 ITEMS"
        messages: list[Message] = [
            {"role": "system", "content": prompts.SYSTEM_TOOLS},
            user(prompts.tool_instruction("lookup_order", args)),
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
        attempt = await self.ask(gate_ctx, "continuation", messages, self.max_tokens, tools=prompts.TOOLS)
        checks = Checks()
        if result := answered(checks, None, attempt):
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
