"""SSE decoding and chat-stream assembly, fed by hand with arrival times."""

from __future__ import annotations

import json
from typing import Any

from anvil_ctl.qualify.client import SSEDecoder, StreamAssembler


def chunk(**delta: Any) -> str:
    finish = delta.pop("finish_reason", None)
    return json.dumps({"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def usage(prompt: int, completion: int) -> str:
    return json.dumps(
        {
            "model": "m",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


class TestSSEDecoder:
    def test_a_blank_line_dispatches_the_accumulated_data(self) -> None:
        d = SSEDecoder()
        assert d.feed('data: {"a": 1}') is None
        assert d.feed("") == '{"a": 1}'

    def test_multiple_data_lines_join_with_newlines_and_comments_are_ignored(self) -> None:
        d = SSEDecoder()
        for line in (": keep-alive", "event: message", "data: one", "data:two"):
            assert d.feed(line) is None
        assert d.feed("\r") == "one\ntwo"

    def test_an_unterminated_event_is_reported_pending(self) -> None:
        d = SSEDecoder()
        d.feed('data: {"partial"')
        assert d.pending


class TestStreamAssembler:
    def test_content_reasoning_usage_and_timing_come_from_the_stream(self) -> None:
        a = StreamAssembler(t0=10.0)
        a.feed(chunk(role="assistant"), 10.1)
        a.feed(chunk(reasoning_content="thin"), 10.5)
        a.feed(chunk(reasoning_content="king"), 10.6)
        a.feed(chunk(content="Hel"), 11.0)
        a.feed(chunk(content="lo", finish_reason="stop"), 11.2)
        a.feed(usage(100, 5), 11.3)
        a.feed("[DONE]", 11.4)
        r = a.finish(11.4, status=200)
        assert r.content == "Hello"
        assert r.reasoning == "thinking"
        assert r.ttfo_s == 0.5
        assert r.ttft_s == 1.0
        assert round(r.e2e_s, 6) == 1.4
        assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (
            100,
            5,
        )
        assert r.finish_reason == "stop"
        assert r.done and not r.truncated

    def test_tool_call_deltas_are_assembled_by_index(self) -> None:
        a = StreamAssembler(t0=0.0)
        a.feed(
            json.dumps(
                {
                    "choices": [
                        {
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 1,
                                        "id": "c2",
                                        "function": {"name": "b", "arguments": '{"y"'},
                                    },
                                    {
                                        "index": 0,
                                        "id": "c1",
                                        "function": {"name": "a", "arguments": ""},
                                    },
                                ]
                            }
                        }
                    ]
                }
            ),
            0.1,
        )
        a.feed(
            json.dumps(
                {
                    "choices": [
                        {
                            "delta": {
                                "tool_calls": [
                                    {"index": 0, "function": {"arguments": '{"x": 1}'}},
                                    {"index": 1, "function": {"name": "b", "arguments": ": 2}"}},
                                ]
                            },
                            "finish_reason": "tool_calls",
                        }
                    ]
                }
            ),
            0.2,
        )
        a.feed("[DONE]", 0.3)
        r = a.finish(0.3, status=200)
        assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
            ("c1", "a", '{"x": 1}'),
            ("c2", "b", '{"y": 2}'),
        ]
        assert r.finish_reason == "tool_calls"
        assert r.ttft_s is None and r.ttfo_s == 0.1

    def test_a_stream_without_done_is_truncated(self) -> None:
        a = StreamAssembler(t0=0.0)
        a.feed(chunk(content="half"), 0.1)
        r = a.finish(0.2, status=200, transport_error="stream broken: RemoteProtocolError")
        assert r.truncated and not r.done
        assert r.content == "half"
        assert r.errors == ("stream broken: RemoteProtocolError",)

    def test_unparseable_events_and_error_objects_are_recorded(self) -> None:
        a = StreamAssembler(t0=0.0)
        a.feed("{not json", 0.1)
        a.feed(json.dumps({"error": {"message": "boom"}}), 0.2)
        a.feed("[DONE]", 0.3)
        r = a.finish(0.3, status=200)
        assert len(r.errors) == 2
        assert "boom" in r.errors[1]
