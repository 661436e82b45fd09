"""What every gate shares: its context, its base class, and the requests and checks of chat
gates. A gate never raises for a model's failure: an engine error fails the gate."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, TypeVar

from anvil_ctl.core.engine_profile import OPENAI_COMPATIBLE, EngineProfile
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import ContainerLog
from anvil_ctl.qualify.client import EngineClient, Message, tool_arguments
from anvil_ctl.qualify.results import ChatResult, GateKind, GateResult
from anvil_ctl.qualify.tokens import complete_usage

ReserveReading = tuple[str, int, int]
"""(GPU UUID, free MiB, required reserve MiB) for one card."""
ReserveProbe = Callable[[], list[ReserveReading]]
LogReader = Callable[[int, int], ContainerLog]
"""(max lines, max bytes) -> the candidate container's bounded log, restart count and OOM flag."""
RequestListener = Callable[[str, bool, str], None]
"""Called once per finished request: (gate name, ok, short detail)."""

FIXTURES_DIR = Path(__file__).resolve().parent.parent.parent / "fixtures"
T = TypeVar("T")


@dataclass
class GateContext:
    """Everything a gate may use: the client, the served model and run-wide settings."""

    client: EngineClient
    served_model: str
    thinking: bool | None = False
    max_model_len: int | None = None
    chars_per_token: float = 4.0
    fixtures_dir: Path = FIXTURES_DIR
    reserve_probe: ReserveProbe | None = None
    on_request: RequestListener = field(default=lambda _gate, _ok, _detail: None)
    container_log: LogReader | None = None
    engine: EngineProfile = OPENAI_COMPATIBLE
    """How the engine reports usage, counts tokens and logs (never which engine it is): the
    log audit reads its fatal, notice and start-banner patterns."""
    secrets: tuple[str, ...] = ()
    """Values never to write into evidence (router tokens); the log audit redacts them."""


@dataclass(frozen=True)
class Attempt:
    """One request's outcome: its result, or the error that replaced it."""

    label: str
    result: ChatResult | None
    error: str | None = None
    error_kind: str | None = None
    usage_counted: JSONObject | None = None
    """How the usage was counted when the engine's stream carried none."""

    def as_dict(self) -> JSONObject:
        data: JSONObject = {
            "label": self.label,
            "result": self.result.as_dict() if self.result else None,
            "error": self.error,
            "error_kind": self.error_kind,
        }
        if self.usage_counted is not None:
            data["usage_counted"] = self.usage_counted
        return data


def long_prompt(nominal: int, requested: int, text: str, attempt: Attempt) -> JSONObject:
    """A long-context request as evidence: the nominal and requested sizes, the engine's count,
    and the prompt's size, SHA-256 and tail (never the whole text)."""
    usage = attempt.result.usage if attempt.result else None
    return {
        "nominal_tokens": nominal,
        "requested_tokens": requested,
        "measured_prompt_tokens": usage.prompt_tokens if usage else None,
        "prompt": {
            "chars": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "tail": text[-300:],
        },
    }


@dataclass(kw_only=True, eq=False)
class Gate:
    """Base of all gates: a dataclass whose fields are the profile's parameters (thresholds).
    Subclasses set `gate_type`, `kind`, their fields, and implement `run`."""

    gate_type: ClassVar[str] = "gate"
    kind: ClassVar[GateKind] = "functional"
    name: str = ""
    """Unique in its profile; the gate type when not given."""

    def __post_init__(self) -> None:
        self.name = self.name or self.gate_type

    def thresholds(self) -> JSONObject:
        """The gate's configuration as recorded in its evidence: its public attributes, the
        profile's parameters, as the evidence encoder writes them (anything not JSON as its str())."""
        public = {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "name"}
        encoded: JSONObject = json.loads(json.dumps(public, default=str))
        return encoded

    async def __call__(self, gate_ctx: GateContext) -> GateResult:
        started = time.perf_counter()
        try:
            result = await self.run(gate_ctx)
        except AnvilError as exc:
            # An engine refusing or breaking outside a per-request guard still yields
            # a result: the evidence records why, and the gate fails.
            result = self.result(
                False, "error", {"error": str(exc), "error_type": type(exc).__name__}, str(exc)
            )
        evidence: JSONObject = {
            "gate_type": self.gate_type,
            "thresholds": self.thresholds(),
            **result.evidence,
        }
        return replace(result, evidence=evidence, duration_s=round(time.perf_counter() - started, 6))

    async def run(self, gate_ctx: GateContext) -> GateResult:
        raise NotImplementedError

    def result(
        self, passed: bool, classification: str, evidence: JSONObject, summary: str = ""
    ) -> GateResult:
        return GateResult(
            self.name, passed, self.kind, "pass" if passed else classification, evidence, summary
        )

    async def attempt(self, gate_ctx: GateContext, label: str, body: JSONObject) -> Attempt:
        """Send one chat request; an engine error becomes a failed Attempt, not an exception."""
        try:
            result = await gate_ctx.client.chat(body)
        except AnvilError as exc:
            gate_ctx.on_request(self.name, False, f"{label}: {exc}")
            return Attempt(label, None, str(exc), type(exc).__name__)
        # Counted after the request finished, so its timing is the engine's alone.
        result, counted = await complete_usage(gate_ctx.client, gate_ctx.engine, body, result)
        return Attempt(label, result, usage_counted=counted)

    async def ask(
        self,
        gate_ctx: GateContext,
        label: str,
        messages: Sequence[Message],
        max_tokens: int,
        *,
        tools: Sequence[JSONObject] | None = None,
        response_format: JSONObject | None = None,
        stream: bool = False,
        thinking: bool | None = None,
    ) -> Attempt:
        """`attempt` of a chat request of the served model, with the run's thinking setting unless
        `thinking` is given."""
        request = EngineClient.chat_body(
            gate_ctx.served_model,
            messages,
            max_tokens=max_tokens,
            enable_thinking=gate_ctx.thinking if thinking is None else thinking,
            tools=tools,
            response_format=response_format,
            stream=stream,
        )
        return await self.attempt(gate_ctx, label, request)

    async def repeat(
        self,
        gate_ctx: GateContext,
        cases: Sequence[tuple[str, Sequence[Message], int]],
        repetitions: int,
        concurrency: int,
    ) -> list[Attempt]:
        """Each case (id, messages, max_tokens) asked `repetitions` times as `id#n`, case by case
        within a repetition, at most `concurrency` at once; attempts in that order."""
        jobs = [
            functools.partial(self.ask, gate_ctx, f"{case_id}#{rep + 1}", messages, max_tokens)
            for rep in range(repetitions)
            for case_id, messages, max_tokens in cases
        ]
        return await gather_limited(concurrency, jobs)


async def gather_limited(concurrency: int, jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run jobs with at most `concurrency` in flight; results in job order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await job()

    return list(await asyncio.gather(*(one(job) for job in jobs)))


def stream_problem(result: ChatResult) -> str | None:
    """Why a streamed result cannot be trusted, or None."""
    if result.truncated:
        return "truncated_stream"
    if result.errors:
        return "stream_error"
    return None


_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_EDGE = "`'\" \t\r\n."


def normalize(text: str) -> str:
    """Whitespace collapsed, surrounding quotes/backticks/periods removed."""
    return " ".join(text.split()).strip(_EDGE)


def same_text(observed: str, expected: str, *, case: bool = True) -> bool:
    a, b = normalize(observed), normalize(expected)
    return a == b if case else a.casefold() == b.casefold()


def parse_json(text: str) -> tuple[bool, JSONValue]:
    """(True, value) when `text` (maybe in a code fence) is JSON, else (False, error)."""
    text = text.strip()
    fenced = _FENCE.match(text)
    try:
        value: JSONValue = json.loads(fenced.group(1).strip() if fenced else text)
        return True, value
    except json.JSONDecodeError as exc:
        return False, str(exc)


def has_think_markup(text: str) -> bool:
    lowered = text.lower()
    return "<think>" in lowered or "</think>" in lowered


@dataclass
class Checks:
    """An ordered list of named checks; the first failed one classifies the gate."""

    items: list[JSONObject] = field(default_factory=list)

    def add(self, check: str, ok: bool, classification: str, **observed: JSONValue) -> bool:
        self.items.append({"check": check, "ok": ok, "classification": classification, **observed})
        return ok

    @property
    def passed(self) -> bool:
        return all(item["ok"] for item in self.items)

    @property
    def classification(self) -> str:
        return next((str(item["classification"]) for item in self.items if not item["ok"]), "pass")

    @property
    def failed(self) -> list[str]:
        return [str(item["check"]) for item in self.items if not item["ok"]]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def answered(checks: Checks, label: str | None, attempt: Attempt) -> ChatResult | None:
    """The attempt's result if it answered and, when streamed, its stream completed (recording both
    checks, named after `label` when given); None when either failed."""
    result = attempt.result
    check = f"{label}: answered" if label else "answered"
    if not checks.add(check, result is not None, "error", error=attempt.error):
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
    return min(requested, gate_ctx.max_model_len) if gate_ctx.max_model_len else requested


def finish(
    gate: Gate,
    checks: Checks,
    attempts: list[Attempt] | None,
    summary: str = "",
    extra: JSONObject | None = None,
    *,
    passed: bool = True,
) -> GateResult:
    """The gate's result: its checks, every request (if any is recorded), and `extra` evidence;
    it passes when every check and `passed` do."""
    evidence: JSONObject = {"checks": [*checks.items]}
    if attempts is not None:
        evidence["requests"] = [a.as_dict() for a in attempts]
    if not summary:
        summary = "all checks pass" if checks.passed else "failed: " + ", ".join(checks.failed[:5])
    return gate.result(
        checks.passed and passed, checks.classification, {**evidence, **(extra or {})}, summary
    )
