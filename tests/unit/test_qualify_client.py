"""The engine client on httpx.MockTransport: parsing, streaming, error translation."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.qualify.client import EngineClient, image_part, parse_responses
from anvil_ctl.qualify.results import ChatResult


def sse(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


def run_chat(handler: httpx.MockTransport, body: dict[str, object]) -> ChatResult:
    async def go() -> ChatResult:
        async with EngineClient("http://engine", transport=handler) as client:
            return await client.chat(body)

    return asyncio.run(go())


class TestChat:
    def test_a_plain_answer_is_parsed_with_reasoning_and_tool_calls(self) -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            assert json.loads(request.content)["chat_template_kwargs"] == {"enable_thinking": True}
            return httpx.Response(
                200,
                json={
                    "model": "m",
                    "choices": [
                        {
                            "finish_reason": "tool_calls",
                            "message": {
                                "content": None,
                                "reasoning_content": "hmm",
                                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                },
            )

        body = EngineClient.chat_body("m", [{"role": "user", "content": "x"}], enable_thinking=True)
        r = run_chat(httpx.MockTransport(handler), body)
        assert (r.content, r.reasoning, r.finish_reason) == ("", "hmm", "tool_calls")
        assert r.tool_calls[0].name == "f"
        assert r.usage is not None and r.usage.total_tokens == 5
        assert not r.streamed and r.ttft_s is None

    def test_a_stream_requests_usage_and_is_assembled(self) -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            assert body["stream_options"] == {"include_usage": True}
            return httpx.Response(
                200,
                content=sse(
                    json.dumps({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}),
                    json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
                    "[DONE]",
                ),
                headers={"content-type": "text/event-stream"},
            )

        body = EngineClient.chat_body("m", [], stream=True)
        r = run_chat(httpx.MockTransport(handler), body)
        assert r.streamed and r.done and r.content == "ok"
        assert r.ttft_s is not None and r.ttft_s >= 0

    def test_a_stream_that_breaks_midway_comes_back_truncated(self) -> None:
        class Broken(httpx.AsyncByteStream):
            async def __aiter__(self) -> Iterator[bytes]:  # type: ignore[override]
                yield sse(json.dumps({"choices": [{"delta": {"content": "par"}}]}))
                raise httpx.RemoteProtocolError("peer closed connection")

        transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=Broken()))
        r = run_chat(transport, EngineClient.chat_body("m", [], stream=True))
        assert r.truncated and r.content == "par"
        assert any("peer closed" in e for e in r.errors)

    @pytest.mark.parametrize(("status", "error"), [(503, TransientError), (400, AdapterError)])
    def test_http_errors_are_translated(self, status: int, error: type[Exception]) -> None:
        transport = httpx.MockTransport(lambda request: httpx.Response(status, text="nope"))
        with pytest.raises(error) as info:
            run_chat(transport, EngineClient.chat_body("m", []))
        assert info.value.data["status"] == status  # type: ignore[attr-defined]

    def test_a_refused_connection_is_transient(self) -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused")

        with pytest.raises(TransientError):
            run_chat(httpx.MockTransport(handler), EngineClient.chat_body("m", []))


class TestResponsesAndImages:
    def test_output_text_is_read_from_message_parts(self) -> None:
        r = parse_responses(
            {
                "status": "completed",
                "output": [
                    {"type": "reasoning"},
                    {
                        "type": "message",
                        "content": [
                            {"type": "output_text", "text": "A"},
                            {"type": "output_text", "text": "B"},
                        ],
                    },
                ],
            },
            status=200,
            e2e_s=0.1,
        )
        assert r.text == "AB" and r.output_types == ("reasoning", "message")

    def test_an_image_travels_as_a_base64_data_url(self) -> None:
        part = image_part(b"\x89PNG")
        url = part["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        assert base64.b64decode(url.split(",", 1)[1]) == b"\x89PNG"

    def test_models_lists_ids_and_max_model_len(self) -> None:
        transport = httpx.MockTransport(
            lambda request: httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        )

        async def go() -> list[object]:
            async with EngineClient("http://engine", transport=transport) as client:
                return list(await client.models())

        cards = asyncio.run(go())
        assert cards[0].id == "m" and cards[0].max_model_len == 4096  # type: ignore[attr-defined]
