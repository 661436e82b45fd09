"""The paired benchmark's bare sequence asks the engine for what anvilctl asks for.

The stub decodes what it is asked (recipes run it with `--verbose-default`), so a bare chat
with another prompt or token budget times the stub, not the sequence: the bare smoke "smoke"
once cost 0.27 s to anvilctl's 0.02 s and made promote look 4x cheaper next to it.
"""

from __future__ import annotations

import json

import httpx

from anvil_ctl import acceptance
from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.adapters.router_http import routed_chat
from benchmarks.paired import ALIAS, TIER, Bare

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
        _bare(bodies).acceptance(MODEL)
        plain, stream, tool = bodies
        assert plain["messages"] == [{"role": "user", "content": acceptance.PLAIN_PROMPT}]
        assert stream["messages"] == [{"role": "user", "content": acceptance.STREAM_PROMPT}]
        assert stream["stream"] is True
        assert tool["messages"] == [{"role": "user", "content": acceptance.TOOL_PROMPT}]
        assert tool["tools"] == acceptance.TOOLS
        # the acceptance module's own token budgets (64, 64, 256): the stub decodes up to them
        assert [plain["max_tokens"], stream["max_tokens"], tool["max_tokens"]] == [64, 64, 256]
