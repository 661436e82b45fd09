"""The stub engine's answer rules and token accounting (pure functions, no server)."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest

from anvil_stub.options import parse_options
from anvil_stub.rules import (
    BadRequest,
    ToolCall,
    chat_prompt,
    complete,
    decide,
    png_text,
    responses_prompt,
)


def png_with_text(text: str) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"tEXt", b"anvil-text\0" + text.encode("latin-1"))
        + chunk(b"IDAT", zlib.compress(b"\0\0"))
        + chunk(b"IEND", b"")
    )


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": text}


def answer(body: dict[str, object], faults: frozenset[str] = frozenset()) -> str | ToolCall:
    return decide(chat_prompt(body), answer_book=[], faults=faults)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


class TestAnswerRules:
    def test_a_tool_message_is_acknowledged_with_its_content(self) -> None:
        body = {"messages": [user("x"), {"role": "tool", "content": "22C", "tool_call_id": "1"}]}
        assert answer(body) == "Tool result received: 22C"

    def test_a_tool_instruction_becomes_a_call_with_exactly_that_json(self) -> None:
        text = 'Please call `get_weather` with arguments JSON {"city": "Oslo", "days": 2}\nthanks'
        result = answer({"messages": [user(text)], "tools": TOOLS})
        assert result == ToolCall("get_weather", '{"city": "Oslo", "days": 2}')

    def test_a_tool_not_offered_is_not_called(self) -> None:
        text = 'call `launch` with arguments JSON {"x": 1}'
        assert answer({"messages": [user(text)], "tools": TOOLS}) == "Stub answer."

    def test_fault_bad_tool_args_changes_exactly_one_value(self) -> None:
        text = 'call `get_weather` with arguments JSON {"city": "Oslo", "days": 2}'
        result = answer({"messages": [user(text)], "tools": TOOLS}, frozenset({"bad-tool-args"}))
        assert isinstance(result, ToolCall)
        assert json.loads(result.arguments) == {"city": "Oslo-wrong", "days": 2}

    def test_json_mode_returns_the_requested_document(self) -> None:
        body = {
            "messages": [user('Return exactly this JSON: {"ok": true, "n": 3}')],
            "response_format": {"type": "json_object"},
        }
        assert json.loads(str(answer(body))) == {"ok": True, "n": 3}

    def test_fault_bad_json_cuts_the_document(self) -> None:
        body = {
            "messages": [user('Return exactly this JSON: {"ok": true, "n": 3}')],
            "response_format": {"type": "json_schema", "json_schema": {}},
        }
        with pytest.raises(ValueError):
            json.loads(str(answer(body, frozenset({"bad-json"}))))

    def test_the_answer_book_matches_the_last_user_message_first_entry_wins(self) -> None:
        prompt = chat_prompt({"messages": [user("what is the capital of France?")]})
        book = [("capital of France", "Paris"), ("France", "wrong")]
        assert decide(prompt, answer_book=book, faults=frozenset()) == "Paris"

    def test_the_needle_is_found_anywhere_in_the_prompt(self) -> None:
        body = {
            "messages": [
                {"role": "system", "content": "filler. The needle is blue-42. more filler"},
                user("What is the needle?"),
            ]
        }
        assert answer(body) == "blue-42"

    def test_image_text_is_read_from_the_png_text_chunk_joined_by_spaces(self) -> None:
        parts = [
            {"type": "text", "text": "What text is in the image?"},
            {"type": "image_url", "image_url": {"url": data_url(png_with_text("ALPHA 7"))}},
            {"type": "image_url", "image_url": {"url": data_url(png_with_text("BETA"))}},
        ]
        assert answer({"messages": [{"role": "user", "content": parts}]}) == "ALPHA 7 BETA"

    def test_reply_with_exactly_returns_the_rest_of_that_line(self) -> None:
        assert answer({"messages": [user("Reply with exactly: pong 1\nignored")]}) == "pong 1"

    def test_anything_else_gets_the_default_answer(self) -> None:
        assert answer({"messages": [user("hello")]}) == "Stub answer."

    def test_a_remote_image_url_is_refused_because_the_stub_never_fetches(self) -> None:
        parts = [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]
        with pytest.raises(BadRequest):
            chat_prompt({"messages": [{"role": "user", "content": parts}]})

    def test_a_non_png_image_is_refused(self) -> None:
        with pytest.raises(BadRequest):
            png_text(b"GIF89a")


def run(body: dict[str, object], *, faults: frozenset[str] = frozenset(), verbose: bool = False):  # type: ignore[no-untyped-def]
    return complete(
        chat_prompt(body),
        answer_book=[],
        faults=faults,
        reasoning_tokens=16,
        verbose_default=verbose,
        default_max_tokens=256,
    )


class TestTokenAccounting:
    def test_prompt_tokens_are_bytes_over_four_rounded_up_plus_eight_per_message(self) -> None:
        prompt = chat_prompt({"messages": [user("12345"), {"role": "assistant", "content": "abc"}]})
        assert prompt.tokens == 2 + 16  # 8 bytes -> 2 tokens, two messages

    def test_each_image_counts_256_tokens(self) -> None:
        parts = [{"type": "image_url", "image_url": {"url": data_url(png_with_text("x"))}}]
        prompt = chat_prompt({"messages": [{"role": "user", "content": parts}]})
        assert prompt.tokens == 8 + 256

    def test_thinking_is_on_by_default_and_adds_the_reasoning_tokens(self) -> None:
        c = run({"messages": [user("Reply with exactly: abcdefgh")]})
        assert len(c.reasoning_tokens) == 16
        assert c.content == "abcdefgh"
        assert c.completion_tokens == 18
        assert c.finish_reason == "stop"

    def test_thinking_disabled_emits_no_reasoning(self) -> None:
        c = run(
            {
                "messages": [user("Reply with exactly: ok")],
                "chat_template_kwargs": {"enable_thinking": False},
            }
        )
        assert c.reasoning == ""
        assert c.content == "ok"

    def test_max_tokens_caps_reasoning_first_and_reports_length(self) -> None:
        c = run({"messages": [user("Reply with exactly: abcdefgh")], "max_tokens": 17})
        assert len(c.reasoning_tokens) == 16
        assert c.content == "abcd"
        assert c.finish_reason == "length"
        assert c.completion_tokens == 17

    def test_fault_ignore_max_tokens_overruns_the_cap(self) -> None:
        c = run(
            {"messages": [user("Reply with exactly: abcdefgh")], "max_tokens": 2},
            faults=frozenset({"ignore-max-tokens"}),
        )
        assert c.completion_tokens == 18
        assert c.finish_reason == "stop"

    def test_fault_no_reasoning_never_emits_reasoning_even_with_thinking_on(self) -> None:
        c = run({"messages": [user("hi")]}, faults=frozenset({"no-reasoning"}))
        assert c.reasoning_tokens == ()

    def test_fault_reasoning_leak_puts_think_tags_into_the_content_when_thinking_is_off(
        self,
    ) -> None:
        c = run(
            {"messages": [user("hi")], "chat_template_kwargs": {"enable_thinking": False}},
            faults=frozenset({"reasoning-leak"}),
        )
        assert c.content.startswith("<think>")
        assert "</think>Stub answer." in c.content

    def test_verbose_default_fills_max_tokens(self) -> None:
        c = run(
            {
                "messages": [user("hi")],
                "max_tokens": 40,
                "chat_template_kwargs": {"enable_thinking": False},
            },
            verbose=True,
        )
        assert c.completion_tokens == 40
        assert c.content.startswith("Stub answer. Stub answer.")


class TestResponsesPrompt:
    def test_a_string_input_is_one_user_message_and_instructions_a_system_one(self) -> None:
        p = responses_prompt({"input": "Reply with exactly: x", "instructions": "be brief"})
        assert [(m.role, m.text) for m in p.messages] == [
            ("system", "be brief"),
            ("user", "Reply with exactly: x"),
        ]

    def test_input_text_parts_are_read(self) -> None:
        p = responses_prompt({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
        assert p.messages[0].text == "hi"

    def test_an_empty_input_is_refused(self) -> None:
        with pytest.raises(BadRequest):
            responses_prompt({"input": []})


class TestOptions:
    def test_env_twins_set_options(self) -> None:
        env = {
            "ANVIL_STUB_SERVED_MODEL": "from-env",
            "ANVIL_STUB_PORT": "9001",
            "ANVIL_STUB_FAIL_HEALTH": "1",
            "ANVIL_STUB_FAULT": "bad-json,truncate-stream",
        }
        o = parse_options([], env)
        assert (o.served_model, o.port, o.fail_health) == ("from-env", 9001, True)
        assert o.faults == {"bad-json", "truncate-stream"}

    def test_flags_win_over_env(self) -> None:
        env = {"ANVIL_STUB_SERVED_MODEL": "from-env", "ANVIL_STUB_FAULT": "bad-json"}
        o = parse_options(["--served-model", "from-flag", "--fault", "no-reasoning"], env)
        assert o.served_model == "from-flag"
        assert o.faults == {"no-reasoning"}

    def test_an_unknown_fault_is_refused(self) -> None:
        with pytest.raises(SystemExit):
            parse_options(["--fault", "explode"], {})

    def test_gpu_uuids_come_from_nvidia_visible_devices(self) -> None:
        env = {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
        assert parse_options([], env).gpu_uuids == ("GPU-a", "GPU-b")
