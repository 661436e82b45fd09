"""Functional gates of chat: smoke, JSON output, Responses API, needle, thinking control
both ways, an image input, and OCR of fixture images with known text.

Classifications: `pass`, `wrong_answer`, `bad_json`, `reasoning_leak`, `no_usage`,
`no_reasoning_channel`, `truncated_stream`, `stream_error`, `wrong_model`, `incomplete`,
`error`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypedDict

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import Message, image_part, text_part
from anvil_ctl.qualify.gates.base import (
    Attempt,
    Checks,
    Gate,
    GateContext,
    answered,
    check_reply,
    check_visible_answer,
    effective_context,
    finish,
    long_prompt,
    parse_json,
    same_text,
    user,
)
from anvil_ctl.qualify.results import GateResult


@dataclass(kw_only=True, eq=False)
class Smoke(Gate):
    """A plain and a streamed request each answer the marker, with usage, from the served model."""

    gate_type = "smoke"

    marker: str = "ANVIL-SMOKE-OK"
    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        checks = Checks()
        messages = [user(prompts.reply_exactly(self.marker))]
        attempts = [
            await self.ask(gate_ctx, "plain", messages, self.max_tokens),
            await self.ask(gate_ctx, "stream", messages, self.max_tokens, stream=True),
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


JSON_EXPECTED: JSONObject = {"status": "ok", "service": "anvil", "items": [3, 1, 2], "ready": True}
"""What the JSON fixture asks for, exactly (the gate's and a watch's JSON check)."""


def check_json(checks: Checks, attempt: Attempt, expected: JSONObject) -> None:
    """The attempt answered, its content parses as JSON and equals `expected`."""
    if result := answered(checks, None, attempt):
        ok, value = parse_json(result.content)
        if checks.add("parses", ok, "bad_json", observed=result.content[:500], error=None if ok else value):
            checks.add("equals", value == expected, "wrong_answer", expected=expected, observed=value)


@dataclass(kw_only=True, eq=False)
class JsonOutput(Gate):
    """`response_format` json_object: the content parses and equals the requested JSON."""

    gate_type = "json"

    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        messages = [user(prompts.json_instruction(JSON_EXPECTED))]
        json_object: JSONObject = {"type": "json_object"}
        attempt = await self.ask(gate_ctx, "json", messages, self.max_tokens, response_format=json_object)
        checks = Checks()
        check_json(checks, attempt, JSON_EXPECTED)
        return finish(self, checks, [attempt])


@dataclass(kw_only=True, eq=False)
class ResponsesApi(Gate):
    """POST /v1/responses answers the marker as output text."""

    gate_type = "responses"

    marker: str = "ANVIL-RESPONSES-OK"
    max_output_tokens: int = 256

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
            return finish(self, checks, None, str(exc))
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
        failed = "" if checks.passed else ", ".join(checks.failed)
        return finish(self, checks, None, failed, {"response": answer.as_dict()})


@dataclass(kw_only=True, eq=False)
class Needle(Gate):
    """A needle sentence at `depth` of a `context_tokens` prompt is found and returned."""

    gate_type = "needle"

    context_tokens: int = 8192
    depth: float = 0.5
    needle: str = "MAGENTA-7741"
    max_tokens: int = 128

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
        attempt = await self.ask(gate_ctx, "needle", [user(text)], self.max_tokens)
        checks = Checks()
        if result := answered(checks, None, attempt):
            checks.add(
                "needle found",
                self.needle in result.content,
                "wrong_answer",
                expected=self.needle,
                observed=result.content[:300],
            )
        return finish(self, checks, [attempt], extra=long_prompt(nominal, self.context_tokens, text, attempt))


@dataclass(kw_only=True, eq=False)
class ThinkingControl(Gate):
    """Reasoning appears only when enabled; disabled output is clean."""

    gate_type = "thinking"

    enabled_max_tokens: int = 2048
    disabled_max_tokens: int = 256
    directions: list[str] = field(default_factory=lambda: ["enabled", "disabled"])

    def __post_init__(self) -> None:
        super().__post_init__()
        self.directions = self.directions or ["enabled", "disabled"]

    async def run(self, gate_ctx: GateContext) -> GateResult:
        checks = Checks()
        record: dict[str, JSONObject] = {}
        for direction in self.directions:
            enabled = direction == "enabled"
            marker = "THINKING-ON-OK" if enabled else "THINKING-OFF-OK"
            messages = [user(prompts.reply_exactly(marker))]
            max_tokens = self.enabled_max_tokens if enabled else self.disabled_max_tokens
            attempts = []
            for stream in (False, True):
                label = f"{direction}-{'stream' if stream else 'plain'}"
                attempt = await self.ask(
                    gate_ctx, label, messages, max_tokens, stream=stream, thinking=enabled
                )
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
        check, ok, why = (
            ("reasoning channel", bool(result.reasoning.strip()), "no_reasoning_channel")
            if enabled
            else ("zero reasoning", result.reasoning == "", "reasoning_leak")
        )
        checks.add(f"{label}: {check}", ok, why, reasoning_chars=len(result.reasoning))
        check_visible_answer(
            checks,
            label,
            result.content,
            marker,
            check="visible answer",
            observed_chars=300,
            finish_reason=result.finish_reason,
        )


OCR_QUESTION = (
    "What text is in the image? Answer with the text only, in capital letters. "
    "When there are several images, give the text of each in order, separated by a single space."
)


class OcrCase(TypedDict):
    """One OCR case of `ocr_cases.json`: the fixture images, in order, and the text they show."""

    id: str
    images: list[str]
    expected: str


@dataclass(kw_only=True, eq=False)
class Image(Gate):
    """A request carrying a PNG (data URL) is accepted and answered as instructed."""

    gate_type = "image"

    image: str = "ocr-anvil-42.png"
    marker: str = "ANVIL-IMAGE-OK"
    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        png = (gate_ctx.fixtures_dir / self.image).read_bytes()
        content: JSONArray = [image_part(png), text_part(prompts.reply_exactly(self.marker))]
        attempt = await self.ask(gate_ctx, "image", [{"role": "user", "content": content}], self.max_tokens)
        checks = Checks()
        check_reply(checks, "image", attempt, self.marker)
        return finish(self, checks, [attempt])


@dataclass(kw_only=True, eq=False)
class Ocr(Gate):
    """Every fixture case x `repetitions` reads back its known text (case-insensitive)."""

    gate_type = "ocr"

    repetitions: int = 2
    cases: list[str] | None = None
    concurrency: int = 1
    max_tokens: int = 256

    async def run(self, gate_ctx: GateContext) -> GateResult:
        every: list[OcrCase] = json.loads((gate_ctx.fixtures_dir / "ocr_cases.json").read_text())
        cases = [c for c in every if not self.cases or c["id"] in self.cases]

        def messages(case: OcrCase) -> list[Message]:
            parts = [image_part((gate_ctx.fixtures_dir / img).read_bytes()) for img in case["images"]]
            return [{"role": "user", "content": [*parts, text_part(OCR_QUESTION)]}]

        asked = [(c["id"], messages(c), self.max_tokens) for c in cases]
        attempts = await self.repeat(gate_ctx, asked, self.repetitions, self.concurrency)
        checks = Checks()
        correct = 0
        for case, attempt in zip(cases * self.repetitions, attempts, strict=True):
            result = attempt.result
            ok = result is not None and same_text(result.content, case["expected"], case=False)
            checks.add(
                attempt.label,
                ok,
                "error" if result is None else "wrong_answer",
                expected=case["expected"],
                observed=None if result is None else result.content[:300],
                error=attempt.error,
            )
            correct += ok
            gate_ctx.on_request(self.name, ok, attempt.label)
        total = len(attempts)
        counted: JSONObject = {"correct": correct, "total": total}
        return finish(self, checks, attempts, f"{correct}/{total}", counted, passed=total > 0)
