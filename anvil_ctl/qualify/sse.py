"""Server-sent events of an OpenAI-compatible chat stream, decoded without I/O; a stream that ends
without `data: [DONE]` is reported as truncated, never silently accepted."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from anvil_ctl.core.jsontypes import as_text, fields, items, whole
from anvil_ctl.qualify.results import ChatResult, ToolCall, Usage

DONE = "[DONE]"


@dataclass
class SSEDecoder:
    """Line-level SSE decoding (WHATWG rules): `data:` lines accumulate, a blank line dispatches."""

    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> str | None:
        """Feed one line (without its newline); return an event's data when one completes."""
        line = line.rstrip("\r\n")
        if not line:
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        name, _, value = line.partition(":")  # a comment line (":...") has no name
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None

    @property
    def pending(self) -> bool:
        """True when an event was begun but never terminated by a blank line."""
        return bool(self._data)


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAssembler:
    """Folds `chat.completion.chunk` events into a `ChatResult`; `t0` is when the request was sent
    and every `feed` carries its event's arrival time."""

    t0: float
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    done: bool = False
    chunks: int = 0
    output_chunks: int = 0
    errors: list[str] = field(default_factory=list)
    first_content_at: float | None = None
    first_output_at: float | None = None
    first_tool_at: float | None = None

    def feed(self, data: str, at: float) -> None:
        if data.strip() == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.errors.append(f"unparseable event: {data[:200]!r}")
            return
        if not isinstance(chunk, dict):
            self.errors.append(f"event is not an object: {data[:200]!r}")
            return
        self.chunks += 1
        if "error" in chunk:
            self.errors.append(json.dumps(chunk["error"])[:500])
        self.model = chunk.get("model") or self.model
        if isinstance(chunk.get("usage"), dict):
            self.usage = Usage.from_dict(chunk["usage"])
        for choice in chunk.get("choices") or []:
            self._choice(choice, at)

    def _choice(self, event_choice: object, at: float) -> None:
        choice = fields(event_choice)
        delta = fields(choice.get("delta") or {})
        if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")):
            self.output_chunks += 1
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.content.append(text)
            if self.first_content_at is None:
                self.first_content_at = at
            if self.first_output_at is None:
                self.first_output_at = at
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str) and thought:
            self.reasoning.append(thought)
            if self.first_output_at is None:
                self.first_output_at = at
        for delta_part in items(delta.get("tool_calls")):
            part = fields(delta_part)
            index = whole(part.get("index", 0))
            parts = self.tools.setdefault(index, _ToolCallParts())
            if self.first_tool_at is None:
                self.first_tool_at = at
            if self.first_output_at is None:
                self.first_output_at = at
            parts.id = parts.id or as_text(part.get("id"))
            function = fields(part.get("function") or {})
            # Engines send the name once, in the first delta of a call; later deltas
            # that repeat it must not double it.
            parts.name = parts.name or as_text(function.get("name"))
            if function.get("arguments"):
                parts.arguments.append(as_text(function["arguments"]))
        if choice.get("finish_reason"):
            self.finish_reason = as_text(choice["finish_reason"])

    def finish(self, end: float, *, status: int, transport_error: str | None = None) -> ChatResult:
        """The assembled result; `transport_error` names a connection that broke mid-stream."""
        errors = list(self.errors)
        if transport_error:
            errors.append(transport_error)
        calls = tuple(
            ToolCall(id=p.id, name=p.name, arguments="".join(p.arguments))
            for _, p in sorted(self.tools.items())
        )

        def rel(at: float | None) -> float | None:
            return None if at is None else at - self.t0

        return ChatResult(
            status=status,
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=self.usage,
            model=self.model,
            streamed=True,
            done=self.done,
            truncated=not self.done,
            errors=tuple(errors),
            ttft_s=rel(self.first_content_at),
            ttfo_s=rel(self.first_output_at),
            e2e_s=end - self.t0,
            chunks=self.chunks,
            output_chunks=self.output_chunks,
        )
