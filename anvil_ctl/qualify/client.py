"""Async engine client for the OpenAI-compatible API, with timing taken from the stream.

The only HTTP of `anvil_ctl.qualify`: connection failures and 5xx become `TransientError`,
other non-2xx `AdapterError`. Its server-sent events are decoded without I/O; a stream broken
mid-way, or ending without `data: [DONE]`, comes back marked `truncated`, never silently accepted.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from anvil_ctl.core.engine_profile import Tokenizer
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.jsontypes import JSONMapping, JSONObject, JSONValue, as_text, fields, items, whole
from anvil_ctl.core.model import ModelCard
from anvil_ctl.qualify.results import ChatResult, ResponsesResult, ToolCall, Usage

Message = JSONObject
"""One chat message: role, content (text, parts or null) and any tool calls."""


def image_part(png: bytes) -> JSONObject:
    """A chat content part carrying a PNG image as a data URL."""
    url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def text_part(text: str) -> JSONObject:
    return {"type": "text", "text": text}


def _raise_for(response_status: int, body: str, what: str) -> None:
    if response_status < 400:
        return
    excerpt = body[:500]
    error = TransientError if response_status >= 500 else AdapterError
    raise error(f"{what}: HTTP {response_status}: {excerpt}", status=response_status, body=excerpt)


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


class EngineClient:
    """Chat (plain and streaming), Responses and models against one engine endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            transport=transport,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.base_url = base_url.rstrip("/")

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, body: JSONObject | None = None, timeout_s: float | None = None
    ) -> httpx.Response:
        """One request; a transport failure is transient, a non-2xx answer `_raise_for`'s."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
        try:
            response = await self._http.request(method, path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise TransientError(f"{method} {path}: {exc!r}") from exc
        _raise_for(response.status_code, response.text, f"{method} {path}")
        return response

    async def models(self, timeout_s: float | None = None) -> list[ModelCard]:
        response = await self._call("GET", "/v1/models", timeout_s=timeout_s)
        try:
            data = response.json().get("data") or []
        except (ValueError, AttributeError) as exc:
            raise AdapterError(f"GET /v1/models: not a model list: {response.text[:200]}") from exc
        return [
            ModelCard(id=str(m.get("id")), max_model_len=m.get("max_model_len"))
            for m in data
            if isinstance(m, dict)
        ]

    async def tokenize_count(self, tokenizer: Tokenizer, text: str, model: str) -> int:
        """The engine's own token count of raw `text` at its tokenize endpoint."""
        path, count_field = tokenizer.path, tokenizer.count_field
        body: JSONObject = {tokenizer.input_field: text}
        if tokenizer.model_field:
            body[tokenizer.model_field] = model
        response = await self._call("POST", path, body)
        try:
            count = response.json()[count_field]
        except (ValueError, KeyError, TypeError) as exc:
            raise AdapterError(f"POST {path}: no {count_field!r} in {response.text[:200]}") from exc
        if isinstance(count, list):  # a list of prompts counts each
            count = sum(count)
        return int(count)

    @staticmethod
    def chat_body(
        model: str,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        tools: Sequence[JSONObject] | None = None,
        response_format: JSONObject | None = None,
        enable_thinking: bool | None = None,
        stream: bool = False,
        extra: JSONObject | None = None,
    ) -> JSONObject:
        """The request body; `enable_thinking` travels as `chat_template_kwargs`."""
        body: JSONObject = {"model": model, "messages": list(messages), "temperature": 0.0}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if tools:
            body["tools"] = list(tools)
        if response_format is not None:
            body["response_format"] = response_format
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if extra:
            body.update(extra)
        return body

    async def chat(self, body: JSONObject) -> ChatResult:
        """POST /v1/chat/completions; streams (and times the stream) when body says `stream`."""
        if body.get("stream"):
            return await self._chat_stream(body)
        t0 = time.perf_counter()
        response = await self._call("POST", "/v1/chat/completions", body)
        end = time.perf_counter()
        try:
            data = response.json()
            choice = (data.get("choices") or [{}])[0]
            message = choice.get("message") or {}
        except (ValueError, AttributeError, IndexError) as exc:
            raise AdapterError(f"chat completion is not JSON: {response.text[:200]}") from exc
        calls = tuple(
            ToolCall(
                id=str(c.get("id") or ""),
                name=str((c.get("function") or {}).get("name") or ""),
                arguments=str((c.get("function") or {}).get("arguments") or ""),
            )
            for c in message.get("tool_calls") or []
        )
        usage = data.get("usage")
        return ChatResult(
            status=response.status_code,
            content=message.get("content") or "",
            reasoning=message.get("reasoning_content") or message.get("reasoning") or "",
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=Usage.from_dict(usage) if isinstance(usage, dict) else None,
            model=data.get("model"),
            streamed=False,
            e2e_s=end - t0,
        )

    async def _chat_stream(self, body: JSONObject) -> ChatResult:
        t0 = time.perf_counter()
        assembler = StreamAssembler(t0=t0)
        decoder = SSEDecoder()
        broken: str | None = None
        status = 0
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                status = response.status_code
                if status >= 400:
                    text = (await response.aread()).decode(errors="replace")
                    _raise_for(status, text, "POST /v1/chat/completions (stream)")
                try:
                    async for line in response.aiter_lines():
                        data = decoder.feed(line)
                        if data is not None:
                            assembler.feed(data, time.perf_counter())
                except httpx.TransportError as exc:
                    # The connection broke mid-stream: keep what arrived as evidence.
                    broken = f"stream broken: {exc!r}"
        except httpx.HTTPError as exc:
            raise TransientError(f"POST /v1/chat/completions (stream): {exc!r}") from exc
        if decoder.pending:
            assembler.errors.append("stream ended inside an unterminated event")
        return assembler.finish(time.perf_counter(), status=status, transport_error=broken)

    async def responses(
        self, model: str, input_: str, *, max_output_tokens: int, enable_thinking: bool | None
    ) -> ResponsesResult:
        """POST /v1/responses (non-streaming subset)."""
        body: JSONObject = {"model": model, "input": input_, "max_output_tokens": max_output_tokens}
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        t0 = time.perf_counter()
        response = await self._call("POST", "/v1/responses", body)
        end = time.perf_counter()
        try:
            data = response.json()
        except ValueError as exc:
            raise AdapterError(f"responses answer is not JSON: {response.text[:200]}") from exc
        return parse_responses(data, status=response.status_code, e2e_s=end - t0)


def parse_responses(data: JSONMapping, *, status: int, e2e_s: float) -> ResponsesResult:
    """Output text of a Responses API object: `output_text`, else the message parts."""
    output = [item for item in items(data.get("output")) if isinstance(item, dict)]
    texts = [
        str(part.get("text") or "")
        for item in output
        if item.get("type") == "message"
        for part in items(item.get("content"))
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]
    text = data.get("output_text")
    usage = data.get("usage")
    return ResponsesResult(
        status=status,
        text=text if isinstance(text, str) else "".join(texts),
        output_types=tuple(str(item.get("type")) for item in output),
        response_status=_text_or_none(data.get("status")),
        usage=Usage.from_dict(usage) if isinstance(usage, dict) else None,
        model=_text_or_none(data.get("model")),
        e2e_s=e2e_s,
    )


def _text_or_none(value: object) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def tool_arguments(call: ToolCall) -> JSONValue:
    """A tool call's arguments parsed as JSON, or the sentinel string `<unparseable>`."""
    try:
        value: JSONValue = json.loads(call.arguments)
    except json.JSONDecodeError:
        return "<unparseable>"
    return value
