"""What the stub answers and what it costs (docs/CONTRACTS.md), as pure functions."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TOKEN_CHARS = 4
TOKENS_PER_MESSAGE = 8
TOKENS_PER_IMAGE = 256
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_TEXT_KEY = b"anvil-text"
REASONING_TEXT = "Let me think about this request step by step. "

_TOOL_RE = re.compile(r"call `([^`]+)` with arguments JSON (\{.*)$", re.MULTILINE)
_JSON_RE = re.compile(r"Return exactly this JSON: (\{.*)$", re.MULTILINE)
_NEEDLE_RE = re.compile(r"The needle is (.+?)\.(?:\s|$)")
_REPLY_RE = re.compile(r"Reply with exactly: (.*)$", re.MULTILINE)


class BadRequest(ValueError):
    """The request body is not one the stub (or an OpenAI-compatible engine) accepts."""


@dataclass(frozen=True)
class Message:
    role: str
    text: str
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Prompt:
    messages: tuple[Message, ...]
    tools: tuple[str, ...] = ()
    json_mode: bool = False
    thinking: bool = True
    max_tokens: int | None = None

    @property
    def tokens(self) -> int:
        text = "".join(m.text for m in self.messages).encode()
        images = sum(len(m.images) for m in self.messages)
        return (
            math.ceil(len(text) / TOKEN_CHARS)
            + TOKENS_PER_MESSAGE * len(self.messages)
            + TOKENS_PER_IMAGE * images
        )


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


@dataclass(frozen=True)
class Completion:
    """An answer after the cap, split into the tokens that will be emitted, in order."""

    reasoning_tokens: tuple[str, ...] = ()
    content_tokens: tuple[str, ...] = ()
    tool_call: ToolCall | None = None
    tool_tokens: tuple[str, ...] = ()
    finish_reason: str = "stop"

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning_tokens) + len(self.content_tokens) + len(self.tool_tokens)

    @property
    def content(self) -> str:
        return "".join(self.content_tokens)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_tokens)

    @property
    def arguments(self) -> str:
        return "".join(self.tool_tokens)


def split_tokens(text: str) -> tuple[str, ...]:
    return tuple(text[i : i + TOKEN_CHARS] for i in range(0, len(text), TOKEN_CHARS))


# ---------------------------------------------------------------- images


def png_text(data: bytes, key: bytes = IMAGE_TEXT_KEY) -> str | None:
    """The text of the first tEXt chunk with this keyword, or None."""
    if not data.startswith(PNG_SIGNATURE):
        raise BadRequest("image is not a PNG")
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        ctype = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"tEXt":
            keyword, _, text = body.partition(b"\0")
            if keyword == key:
                return text.decode("latin-1")
        elif ctype == b"IEND":
            break
    return None


def decode_data_url(url: str) -> bytes:
    if not url.startswith("data:"):
        raise BadRequest("only data: URLs are accepted for images (the stub never fetches)")
    header, _, payload = url.partition(",")
    try:
        if header.endswith(";base64"):
            return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"bad base64 in image data URL: {exc}") from exc
    return payload.encode("latin-1")


# ---------------------------------------------------------------- parsing


def _parts(content: object) -> tuple[str, tuple[bytes, ...]]:
    """Text and images of one message's content (a string or a list of parts)."""
    if content is None:
        return "", ()
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts")
    texts: list[str] = []
    images: list[bytes] = []
    for part in content:
        if not isinstance(part, dict):
            raise BadRequest("content part must be an object")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            texts.append(str(part.get("text", "")))
        elif kind in ("image_url", "input_image"):
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            if not isinstance(url, str):
                raise BadRequest("image part without a URL")
            images.append(decode_data_url(url))
        else:
            raise BadRequest(f"unsupported content part type {kind!r}")
    return "\n".join(texts), tuple(images)


def _message(raw: object) -> Message:
    if not isinstance(raw, dict) or "role" not in raw:
        raise BadRequest("each message must be an object with a role")
    text, images = _parts(raw.get("content"))
    return Message(role=str(raw["role"]), text=text, images=images)


def _each(value: object) -> Iterable[object]:
    """`value` to iterate over, as a loop over it would (a TypeError when it is not iterable)."""
    if not isinstance(value, Iterable):
        raise TypeError(f"'{type(value).__name__}' object is not iterable")
    return value


def _get(value: object, key: str) -> object:
    """`value.get(key)` of a JSON object (an AttributeError, as the call would raise, for another type)."""
    if not isinstance(value, dict):
        raise AttributeError(f"'{type(value).__name__}' object has no attribute 'get'")
    return value.get(key)


def _thinking(body: Mapping[str, object]) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    return bool(kwargs.get("enable_thinking", True)) if isinstance(kwargs, dict) else True


def _max_tokens(body: Mapping[str, object], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or value < 1:
                raise BadRequest(f"{key} must be a positive integer")
            return value
    return None


def chat_prompt(body: Mapping[str, object]) -> Prompt:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    tools = tuple(
        str(t.get("function", {}).get("name", ""))
        for t in _each(body.get("tools") or ())
        if isinstance(t, dict)
    )
    fmt = body.get("response_format") or {}
    return Prompt(
        messages=tuple(_message(m) for m in messages),
        tools=tools,
        json_mode=isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"),
        thinking=_thinking(body),
        max_tokens=_max_tokens(body, "max_completion_tokens", "max_tokens"),
    )


def responses_prompt(body: Mapping[str, object]) -> Prompt:
    """A /v1/responses request body (the subset: input string or message list) as a Prompt."""
    raw = body.get("input")
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append(Message(role="system", text=instructions))
    if isinstance(raw, str):
        messages.append(Message(role="user", text=raw))
    elif isinstance(raw, list) and raw:
        for item in raw:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                messages.append(Message(role="tool", text=str(item.get("output", ""))))
            elif isinstance(item, dict) and item.get("type") == "function_call":
                messages.append(Message(role="assistant", text=""))
            else:
                messages.append(_message(item))
    else:
        raise BadRequest("input must be a string or a non-empty list of messages")
    tools = tuple(str(t.get("name", "")) for t in _each(body.get("tools") or ()) if isinstance(t, dict))
    text_fmt = _get(body.get("text") or {}, "format") or {}
    return Prompt(
        messages=tuple(messages),
        tools=tools,
        json_mode=isinstance(text_fmt, dict) and text_fmt.get("type") in ("json_object", "json_schema"),
        thinking=_thinking(body),
        max_tokens=_max_tokens(body, "max_output_tokens"),
    )


# ---------------------------------------------------------------- rules


def _break_one_value(arguments: str) -> str:
    """Fault bad-tool-args: the same JSON with one value changed."""
    try:
        obj = json.loads(arguments)
    except ValueError:
        return arguments + "}"
    if not isinstance(obj, dict) or not obj:
        return json.dumps({"unexpected": True})
    key = next(iter(obj))
    value = obj[key]
    if isinstance(value, bool):
        obj[key] = not value
    elif isinstance(value, int | float):
        obj[key] = value + 1
    elif isinstance(value, str):
        obj[key] = value + "-wrong"
    else:
        obj[key] = "wrong"
    return json.dumps(obj)


def decide(prompt: Prompt, *, answer_book: list[tuple[str, str]], faults: frozenset[str]) -> str | ToolCall:
    """The visible answer (content text or one tool call) by the contract's rules."""
    last = prompt.messages[-1]
    text = last.text
    if last.role == "tool":
        return f"Tool result received: {text}"
    if prompt.tools:
        m = _TOOL_RE.search(text)
        if m and m.group(1) in prompt.tools:
            arguments = m.group(2).strip()
            if "bad-tool-args" in faults:
                arguments = _break_one_value(arguments)
            return ToolCall(name=m.group(1), arguments=arguments)
    if prompt.json_mode:
        m = _JSON_RE.search(text)
        if m:
            doc = m.group(1).strip()
            return doc[: len(doc) // 2] if "bad-json" in faults else doc
    last_user = next((msg.text for msg in reversed(prompt.messages) if msg.role == "user"), "")
    for match, answer in answer_book:
        if match in last_user:
            return answer
    if "What is the needle?" in text:
        m = _NEEDLE_RE.search("\n".join(msg.text for msg in prompt.messages))
        if m:
            return m.group(1)
    images = [img for msg in prompt.messages for img in msg.images]
    if images and "What text is in the image?" in text:
        return " ".join(t for t in (png_text(img) for img in images) if t is not None)
    m = _REPLY_RE.search(text)
    if m:
        return m.group(1).strip()
    return "Stub answer."


def complete(
    prompt: Prompt,
    *,
    answer_book: list[tuple[str, str]],
    faults: frozenset[str],
    reasoning_tokens: int,
    verbose_default: bool,
    default_max_tokens: int,
) -> Completion:
    """Decide, add the reasoning channel, apply the max_tokens cap (reasoning first)."""
    visible = decide(prompt, answer_book=answer_book, faults=faults)
    cap = None if "ignore-max-tokens" in faults else prompt.max_tokens
    if verbose_default and visible == "Stub answer.":
        budget = prompt.max_tokens or default_max_tokens
        visible = ("Stub answer. " * (budget * TOKEN_CHARS // 13 + 1))[: budget * TOKEN_CHARS]
    reasoning = ""
    if prompt.thinking and "no-reasoning" not in faults:
        reasoning = (REASONING_TEXT * (reasoning_tokens * TOKEN_CHARS // len(REASONING_TEXT) + 1))[
            : reasoning_tokens * TOKEN_CHARS
        ]
    elif not prompt.thinking and "reasoning-leak" in faults and isinstance(visible, str):
        visible = f"<think>{REASONING_TEXT.strip()}</think>{visible}"
    r_tokens = split_tokens(reasoning)
    body_text = visible.arguments if isinstance(visible, ToolCall) else visible
    b_tokens = split_tokens(body_text)
    finish = "tool_calls" if isinstance(visible, ToolCall) else "stop"
    if cap is not None and len(r_tokens) + len(b_tokens) > cap:
        r_tokens = r_tokens[:cap]
        b_tokens = b_tokens[: cap - len(r_tokens)]
        finish = "length"
    if isinstance(visible, ToolCall):
        return Completion(r_tokens, tool_call=visible, tool_tokens=b_tokens, finish_reason=finish)
    return Completion(r_tokens, content_tokens=b_tokens, finish_reason=finish)


def load_answer_book(text: str) -> list[tuple[str, str]]:
    """Parse an answer book: a JSON list of {"match": substring, "answer": text}."""
    entries = json.loads(text)
    if not isinstance(entries, list):
        raise ValueError("answer book must be a JSON list")
    return [(str(e["match"]), str(e["answer"])) for e in entries]
