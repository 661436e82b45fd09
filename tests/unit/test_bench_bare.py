"""The paired benchmark's bare sequence asks the engine for what anvilctl asks for.

The stub decodes what it is asked (recipes run it with `--verbose-default`), so a bare chat
with another prompt or token budget times the stub, not the sequence. The bare acceptance is
the official client in an interpreter of its own, as the product's is.
"""

from __future__ import annotations

import contextlib
import http.server
import json
from collections.abc import Iterator

import httpx
import pytest

from anvil_ctl import acceptance
from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.adapters.router_http import routed_chat
from benchmarks.paired import ALIAS, TIER, Bare
from tests.unit.loopback import loopback_server

MODEL = "served-model"


def _recorder(bodies: list[dict[str, object]]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/workers":
            return httpx.Response(
                200, json={"workers": [{"is_healthy": True, "labels": {"anvil.tier": TIER}}]}
            )
        body = json.loads(request.content)
        bodies.append(body)
        if body.get("stream"):
            return httpx.Response(200, text="data: {}\n\ndata: [DONE]\n\n")
        message = {"tool_calls": [{"id": "c"}]} if body.get("tools") else {"content": "ok"}
        return httpx.Response(200, json={"model": MODEL, "choices": [{"message": message}]})

    return httpx.MockTransport(answer)


def _bare(bodies: list[dict[str, object]]) -> Bare:
    bare = Bare.__new__(Bare)  # only its HTTP half: no campaign, no Docker
    bare.http = httpx.Client(transport=_recorder(bodies))
    bare.smg, bare.admin, bare.client = "http://smg", {}, {}
    return bare


class TestBareRequests:
    def test_the_bare_smoke_sends_anvilctls_routed_chat_body(self) -> None:
        ours: list[dict[str, object]] = []
        with httpx.Client(transport=_recorder(ours)) as client:
            routed_chat(client, "http://smg", ALIAS, Secret("t", "test"))
        bare: list[dict[str, object]] = []
        _bare(bare).register(MODEL)
        assert [b for b in bare if "messages" in b] == ours

    def test_the_bare_acceptance_sends_the_acceptance_prompts_budgets_and_tool(self) -> None:
        bodies: list[dict[str, object]] = []
        with _engine(bodies) as url:
            bare = _bare([])
            bare.smg, bare.client_token = url, "client-key"
            bare.acceptance(MODEL)
        plain, stream, tool = bodies
        assert plain["messages"] == [{"role": "user", "content": acceptance.PLAIN_PROMPT}]
        assert stream["messages"] == [{"role": "user", "content": acceptance.STREAM_PROMPT}]
        assert stream["stream"] is True
        assert tool["messages"] == [{"role": "user", "content": acceptance.TOOL_PROMPT}]
        assert tool["tools"] == acceptance.TOOLS
        # the acceptance module's own token budgets (64, 64, 256): the stub decodes up to them
        assert [plain["max_tokens"], stream["max_tokens"], tool["max_tokens"]] == [64, 64, 256]
        assert {b["model"] for b in bodies} == {ALIAS}

    def test_the_bare_acceptance_fails_on_another_model(self) -> None:
        bodies: list[dict[str, object]] = []
        with _engine(bodies) as url:
            bare = _bare([])
            bare.smg, bare.client_token = url, "client-key"
            with pytest.raises(SystemExit, match="bare acceptance failed"):
                bare.acceptance("another-model")
        assert len(bodies) == 1  # it stopped at the plain chat's answer


@contextlib.contextmanager
def _engine(bodies: list[dict[str, object]]) -> Iterator[str]:
    """An OpenAI-compatible answerer on loopback for the official client in the child."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.headers["Authorization"] == "Bearer client-key"
            bodies.append(body)
            base = {"id": "c", "created": 0, "model": MODEL}
            if body.get("stream"):
                delta = {"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}
                chunk = {**base, "object": "chat.completion.chunk", "choices": [delta]}
                raw = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                kind = "text/event-stream"
            else:
                call = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                message = {"role": "assistant", "content": "ok"}
                if body.get("tools"):
                    message = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                raw = json.dumps({**base, "object": "chat.completion", "choices": [choice]}).encode()
                kind = "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    with loopback_server(Handler) as url:
        yield url
