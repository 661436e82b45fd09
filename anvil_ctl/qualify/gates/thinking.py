"""Thinking control, both directions, each plain and streamed.

Enabled (`chat_template_kwargs.enable_thinking = true`) must produce a reasoning
channel (`reasoning_content`) and the right visible answer. Disabled must produce
zero reasoning content and clean visible output: the right answer, no `<think>`.
Classifications: `pass`, `reasoning_leak`, `no_reasoning_channel`, `wrong_answer`,
`truncated_stream`, `error`.
"""

from __future__ import annotations

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import EngineClient, Message
from anvil_ctl.qualify.gates.base import Attempt, Gate, GateContext
from anvil_ctl.qualify.gates.chat import answered, check_visible_answer
from anvil_ctl.qualify.gates.checks import Checks
from anvil_ctl.qualify.results import GateResult


class ThinkingControl(Gate):
    """Reasoning appears only when enabled; disabled output is clean."""

    gate_type = "thinking"

    def __init__(
        self,
        *,
        name: str | None = None,
        enabled_max_tokens: int = 2048,
        disabled_max_tokens: int = 256,
        directions: list[str] | None = None,
    ) -> None:
        super().__init__(name=name)
        self.enabled_max_tokens = enabled_max_tokens
        self.disabled_max_tokens = disabled_max_tokens
        self.directions = directions or ["enabled", "disabled"]

    async def run(self, gate_ctx: GateContext) -> GateResult:
        checks = Checks()
        record: dict[str, JSONObject] = {}
        for direction in self.directions:
            enabled = direction == "enabled"
            marker = "THINKING-ON-OK" if enabled else "THINKING-OFF-OK"
            messages: list[Message] = [{"role": "user", "content": prompts.reply_exactly(marker)}]
            attempts = []
            for stream in (False, True):
                request = EngineClient.chat_body(
                    gate_ctx.served_model,
                    messages,
                    max_tokens=self.enabled_max_tokens if enabled else self.disabled_max_tokens,
                    enable_thinking=enabled,
                    stream=stream,
                )
                label = f"{direction}-{'stream' if stream else 'plain'}"
                attempt = await self.attempt(gate_ctx, label, request)
                attempts.append(attempt)
                self._check(checks, attempt, enabled, marker)
            record[direction] = {
                "enable_thinking": enabled,
                "requests": [a.as_dict() for a in attempts],
                "passed": all(c["ok"] for c in checks.items if str(c["check"]).startswith(direction)),
            }
        summary = " ".join(f"{d}={'ok' if record[d]['passed'] else 'FAIL'}" for d in self.directions)
        return self.result(
            checks.passed, checks.classification, {"checks": [*checks.items], **record}, summary
        )

    @staticmethod
    def _check(checks: Checks, attempt: Attempt, enabled: bool, marker: str) -> None:
        label = attempt.label
        result = answered(checks, label, attempt)
        if result is None:
            return
        if enabled:
            checks.add(
                f"{label}: reasoning channel",
                bool(result.reasoning.strip()),
                "no_reasoning_channel",
                reasoning_chars=len(result.reasoning),
            )
        else:
            checks.add(
                f"{label}: zero reasoning",
                result.reasoning == "",
                "reasoning_leak",
                reasoning_chars=len(result.reasoning),
            )
        check_visible_answer(
            checks,
            label,
            result.content,
            marker,
            check="visible answer",
            observed_chars=300,
            finish_reason=result.finish_reason,
        )
