"""Qualification against an engine that behaves like llama-cpp-python, through its profile.

The engine here is an httpx MockTransport with llama.cpp's observable ways: no context
length in /v1/models, a tokenize endpoint, streams that end without a usage chunk, one
token per chunk, answers that echo the request's model. Every difference is handled
through `LLAMA_CPP_PYTHON`'s fields, never by the engine's name.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from anvil_ctl.core.engine_profile import LLAMA_CPP_PYTHON, OPENAI_COMPATIBLE
from anvil_ctl.evidence.bundle import verify_bundle
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.capacity import Capacity
from anvil_ctl.qualify.gates.functional import Smoke
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.results import GateResult
from anvil_ctl.qualify.runner import ENGINE_GATE, NullProgress, run_qualification

MODEL = "smollm2-135m-q4_1-8k"
TEMPLATE_TOKENS = 30  # what the chat template adds (the default system prompt and role markers)


def _tokens(text: str) -> int:
    return len(text.split())


class LlamaLike:
    """The mock engine; records each chat request body."""

    def __init__(self, answer: str = "Hello there, I am a small model and I like rivers") -> None:
        self.answer = answer
        self.chats: list[dict[str, Any]] = []

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return TEMPLATE_TOKENS + sum(_tokens(str(m.get("content") or "")) for m in body["messages"])

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL, "owned_by": "me"}]})
        if request.url.path == "/extras/tokenize/count":
            return httpx.Response(200, json={"count": _tokens(json.loads(request.content)["input"])})
        body = json.loads(request.content)
        self.chats.append(body)
        words = self.answer.split()[: body.get("max_tokens") or 16]
        if not body.get("stream"):
            usage = {
                "prompt_tokens": self.prompt_tokens(body),
                "completion_tokens": len(words),
                "total_tokens": self.prompt_tokens(body) + len(words),
            }
            message = {"role": "assistant", "content": " ".join(words)}
            return httpx.Response(
                200,
                json={
                    "model": body["model"],
                    "choices": [{"message": message, "finish_reason": "length"}],
                    "usage": usage,
                },
            )
        chunks = [{"model": body["model"], "choices": [{"delta": {"role": "assistant"}}]}]
        chunks += [{"model": body["model"], "choices": [{"delta": {"content": " " + w}}]} for w in words]
        chunks.append({"model": body["model"], "choices": [{"delta": {}, "finish_reason": "length"}]})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def run_gate(mock: LlamaLike, gate: Any, **ctx_kw: Any) -> GateResult:
    async def go() -> GateResult:
        transport = httpx.MockTransport(mock.handle)
        async with EngineClient("http://llama.test", transport=transport) as client:
            gate_ctx = GateContext(client=client, served_model=MODEL, **ctx_kw)
            result: GateResult = await gate(gate_ctx)
            return result

    return asyncio.run(go())


class TestStreamsWithoutUsage:
    def test_a_streamed_request_gets_the_engines_own_counts_after_the_timed_stream(self) -> None:
        engine = LlamaLike()
        result = run_gate(engine, Smoke(max_tokens=8), engine=LLAMA_CPP_PYTHON)
        stream = next(r for r in result.evidence["requests"] if r["label"] == "stream")
        assert stream["usage_counted"] == {"prompt": "plain-usage", "completion": "stream-chunks"}
        usage = stream["result"]["usage"]
        assert usage["completion_tokens"] == stream["result"]["output_chunks"] == 8
        # The follow-up is the same request, unstreamed, one token: its usage is the prompt count.
        follow_up = engine.chats[-1]
        assert "stream" not in follow_up and follow_up["max_tokens"] == 1
        assert usage["prompt_tokens"] == engine.prompt_tokens(follow_up)
        usage_checks = [c for c in result.evidence["checks"] if c["check"].endswith(": usage")]
        assert usage_checks and all(c["ok"] for c in usage_checks)
        # The 135M-like answer is wrong, and that is the gate's verdict, not a missing usage.
        assert not result.passed and result.classification == "wrong_answer"

    def test_with_the_openai_compatible_profile_a_missing_usage_chunk_is_the_engines_failure(self) -> None:
        engine = LlamaLike()
        result = run_gate(engine, Smoke(max_tokens=8), engine=OPENAI_COMPATIBLE)
        stream = next(r for r in result.evidence["requests"] if r["label"] == "stream")
        assert "usage_counted" not in stream and stream["result"]["usage"] is None
        assert any(c["check"] == "stream: usage" and not c["ok"] for c in result.evidence["checks"])
        assert len(engine.chats) == 2  # no follow-up counts were asked for

    def test_capacity_cells_are_complete_with_engine_counted_prompts(self) -> None:
        engine = LlamaLike()
        gate = Capacity(contexts=[512, 2048], concurrency=[1], repetitions=2, output_tokens=8)
        result = run_gate(engine, gate, engine=LLAMA_CPP_PYTHON)
        assert result.passed, result.summary
        for cell in result.evidence["cells"]:
            assert (cell["requests"], cell["completed"], cell["failed"]) == (2, 2, 0)
            for row in cell["rows"]:
                assert row["usage_counted"]["prompt"] == "plain-usage"
                assert row["started_at"] > 0 and row["decode_tps"] is not None
            assert cell["prompt_tokens_p50"] > TEMPLATE_TOKENS


class TestTheRunner:
    def test_prompts_are_sized_in_the_engines_own_tokens(self, tmp_path: Path) -> None:
        engine = LlamaLike()
        result = run_qualification(
            "http://llama.test",
            MODEL,
            load_profile("real-small").select(["capacity"]),
            evidence_dir=tmp_path,
            tx_id="tx-size",
            identity_digest="d" * 64,
            transport=httpx.MockTransport(engine.handle),  # type: ignore[arg-type]
            engine=LLAMA_CPP_PYTHON,
            context={"value": 8192, "how": "refusal"},
        )
        identity = result.gates[0].evidence
        assert identity["engine_profile"] == "llama-cpp-python"
        assert identity["context"]["value"] == 8192
        sizing = identity["prompt_sizing"]
        assert sizing["source"] == "/extras/tokenize/count" and sizing["chars_per_token"] > 4
        cells = result.gates[1].evidence["cells"]
        # Sized by the engine's tokenizer (one token per word here), prompt + output budget fill
        # each nominal context, where the stub's 4-bytes rule would make them a third as long.
        for cell in cells:
            nominal = cell["nominal_tokens"]
            assert 0.75 * nominal <= cell["prompt_tokens_p50"] <= nominal, cell["prompt_tokens_p50"]

    def test_an_engine_killed_in_a_gate_is_named_though_the_runtime_reports_it_a_moment_late(
        self, tmp_path: Path
    ) -> None:
        """Its requests fail at once, the runtime says `running` twice more: the run asks the
        runtime again until it reports the exit, and ends with the engine named, not the gate."""
        engine = LlamaLike()
        dead = []
        asked = []

        def handle(request: httpx.Request) -> httpx.Response:
            if dead:
                raise httpx.ConnectError("connection refused", request=request)
            return engine.handle(request)

        class KillAtJson(NullProgress):
            def gate_started(self, name: str, index: int, total: int) -> None:
                if name == "json":
                    dead.append(1)

        def liveness() -> dict[str, Any] | None:
            asked.append(1)
            late = dead and len(asked) >= 4  # after smoke, after json, then once more: running
            return {"container_id": "c" * 64, "status": "exited", "exit_code": 137} if late else None

        result = run_qualification(
            "http://llama.test",
            MODEL,
            load_profile("real-small").select(["smoke", "json", "capacity"]),
            evidence_dir=tmp_path,
            tx_id="tx-late",
            identity_digest="d" * 64,
            transport=httpx.MockTransport(handle),
            engine=LLAMA_CPP_PYTHON,
            liveness=liveness,
            progress=KillAtJson(),
        )
        assert [g.name for g in result.gates] == ["served-identity", "smoke", "json", ENGINE_GATE]
        assert not result.gates[2].passed  # the json gate met a dead engine
        died = result.gates[-1]
        assert died.evidence["during_gate"] == "json" and "exit code 137" in died.summary
        assert len(asked) == 4 and result.outcome == "failed"

    def test_a_gate_failed_by_a_live_engine_does_not_wait_on_the_runtime(self, tmp_path: Path) -> None:
        asked = []

        def liveness() -> dict[str, Any] | None:
            asked.append(1)
            return None

        result = run_qualification(
            "http://llama.test",
            MODEL,
            load_profile("real-small").select(["smoke"]),
            evidence_dir=tmp_path,
            tx_id="tx-wrong",
            identity_digest="d" * 64,
            transport=httpx.MockTransport(LlamaLike(answer="no").handle),  # type: ignore[arg-type]
            engine=LLAMA_CPP_PYTHON,
            liveness=liveness,
        )
        assert [(g.name, g.passed) for g in result.gates] == [("served-identity", True), ("smoke", False)]
        assert asked == [1]  # asked once: the engine answered /v1/models, so the gate failed on its own

    def test_an_engine_that_dies_ends_the_run_with_a_named_failure_and_kept_evidence(
        self, tmp_path: Path
    ) -> None:
        engine = LlamaLike()
        asked = []

        def liveness() -> dict[str, Any] | None:
            asked.append(1)
            return (
                {"container_id": "c" * 64, "status": "exited", "exit_code": 137} if len(asked) >= 2 else None
            )

        profile = load_profile("real-small").select(["smoke", "json", "capacity"])
        result = run_qualification(
            "http://llama.test",
            MODEL,
            profile,
            evidence_dir=tmp_path,
            tx_id="tx-dies",
            identity_digest="d" * 64,
            transport=httpx.MockTransport(engine.handle),  # type: ignore[arg-type]
            engine=LLAMA_CPP_PYTHON,
            liveness=liveness,
        )
        names = [g.name for g in result.gates]
        assert names == ["served-identity", "smoke", "json", ENGINE_GATE]
        died = result.gates[-1]
        assert not died.passed and died.classification == "engine_exited"
        assert died.evidence["during_gate"] == "json" and died.evidence["gates_not_run"] == ["capacity"]
        assert "exit code 137" in died.summary
        assert result.outcome == "failed"
        assert any("engine-alive failed: engine_exited" in r for r in result.decision.reasons)
        assert verify_bundle(Path(result.tx_dir)).ok
