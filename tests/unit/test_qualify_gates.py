"""Every gate against the stub engine run as a local process (127.0.0.1): passing on a good
stub, failing with its evidence kept on a stub configured to break it."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import FIXTURES_DIR, Gate, GateContext
from anvil_ctl.qualify.gates.capacity import Capacity, Endurance
from anvil_ctl.qualify.gates.coding import CodingAgent
from anvil_ctl.qualify.gates.functional import (
    Image,
    JsonOutput,
    Needle,
    Ocr,
    ResponsesApi,
    Smoke,
    ThinkingControl,
)
from anvil_ctl.qualify.gates.host import VramReserve
from anvil_ctl.qualify.gates.tools import LongContextTool, StreamingTool, ToolResultContinuation, Tools
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.results import GateResult
from anvil_ctl.qualify.runner import run_qualification

REPO = Path(__file__).resolve().parents[2]
ANSWER_BOOK = FIXTURES_DIR / "coding_answer_book.json"
MODEL = "qual-model"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


StubFactory = Callable[..., str]


@pytest.fixture
def stub() -> Iterator[StubFactory]:
    """Factory: start a stub engine process with extra flags; returns its base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anvil_stub",
                "--port",
                str(port),
                "--served-model",
                MODEL,
                "--answer-book",
                str(ANSWER_BOOK),
                *flags,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError("stub did not become healthy")

    yield start
    for proc in procs:  # the stub finishes its answers in flight on SIGTERM, as an engine does
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: the test is over, do not fail it here
            proc.kill()
            proc.wait(timeout=30)


def run_gate(url: str, gate: Gate, **ctx_kw: Any) -> GateResult:
    async def go() -> GateResult:
        async with EngineClient(url) as client:
            return await gate(GateContext(client=client, served_model=MODEL, **ctx_kw))

    return asyncio.run(go())


GOOD: list[tuple[str, Callable[[], Gate]]] = [
    ("smoke", Smoke),
    ("json", JsonOutput),
    ("tools", lambda: Tools(count=20, prefix_tokens=256)),
    ("long_context_tool", lambda: LongContextTool(context_tokens=8192)),
    ("streaming_tool", StreamingTool),
    ("tool_result", ToolResultContinuation),
    ("responses", ResponsesApi),
    ("image", Image),
    ("ocr", lambda: Ocr(repetitions=2)),
    ("needle", lambda: Needle(context_tokens=8192)),
    ("thinking", ThinkingControl),
    ("coding", lambda: CodingAgent(repetitions=3)),
    (
        "capacity",
        lambda: Capacity(contexts=[2048], concurrency=[1, 2], repetitions=3, output_tokens=16),
    ),
    (
        "endurance",
        lambda: Endurance(requests=6, concurrency=2, context_tokens=1024, output_tokens=8),
    ),
]


class TestGatesOnAGoodStub:
    @pytest.mark.parametrize(("name", "make"), GOOD, ids=[n for n, _ in GOOD])
    def test_each_gate_passes_with_evidence(
        self, stub: StubFactory, name: str, make: Callable[[], Gate]
    ) -> None:
        url = stub()
        result = run_gate(url, make())
        assert result.passed, json.dumps(asdict(result), indent=1)[:3000]
        assert result.name == name
        assert result.classification == "pass"
        assert result.evidence["gate_type"] == name
        assert result.evidence["thresholds"] is not None


BROKEN: list[tuple[str, tuple[str, ...], Callable[[], Gate], str]] = [
    ("tools", ("--fault", "bad-tool-args"), lambda: Tools(count=5), "bad_tool_args"),
    (
        "long_context_tool",
        ("--fault", "bad-tool-args"),
        lambda: LongContextTool(context_tokens=4096),
        "bad_tool_args",
    ),
    ("streaming_tool", ("--fault", "bad-tool-args"), StreamingTool, "bad_tool_args"),
    ("streaming_tool", ("--fault", "truncate-stream"), StreamingTool, "truncated_stream"),
    ("smoke", ("--fault", "truncate-stream"), Smoke, "truncated_stream"),
    ("thinking", ("--fault", "reasoning-leak"), ThinkingControl, "reasoning_leak"),
    ("thinking", ("--fault", "no-reasoning"), ThinkingControl, "no_reasoning_channel"),
    ("thinking", ("--fault", "truncate-stream"), ThinkingControl, "truncated_stream"),
    ("json", ("--fault", "bad-json"), JsonOutput, "bad_json"),
    ("coding", ("--fault", "reasoning-leak"), lambda: CodingAgent(repetitions=1), "reasoning_leak"),
    (
        "capacity",
        ("--fault", "truncate-stream"),
        lambda: Capacity(contexts=[1024], repetitions=2, output_tokens=16),
        "incomplete",
    ),
    (
        "endurance",
        ("--fault", "truncate-stream"),
        lambda: Endurance(requests=4, context_tokens=1024, output_tokens=16),
        "incomplete",
    ),
    ("smoke", ("--wrong-served-name", "other"), Smoke, "wrong_model"),
    ("needle", ("--max-model-len", "2048"), lambda: Needle(context_tokens=4096), "pass"),
]


class TestGatesOnABrokenStub:
    @pytest.mark.parametrize(
        ("name", "flags", "make", "classification"),
        BROKEN,
        ids=[f"{n}-{'-'.join(f).strip('-')}" for n, f, _, _ in BROKEN],
    )
    def test_gate_fails_and_keeps_the_failing_evidence(
        self,
        stub: StubFactory,
        name: str,
        flags: tuple[str, ...],
        make: Callable[[], Gate],
        classification: str,
    ) -> None:
        url = stub(*flags)
        result = run_gate(url, make(), max_model_len=2048 if "--max-model-len" in flags else None)
        if classification == "pass":
            # A context above max_model_len is clamped, not sent to a certain 400.
            assert result.passed
            assert result.evidence["nominal_tokens"] == 2048
            assert result.evidence["requested_tokens"] == 4096
            return
        assert not result.passed
        assert result.classification == classification
        failing = [c for c in result.evidence.get("checks", []) if not c["ok"]]
        kept = (
            failing
            or result.evidence.get("results")
            or result.evidence.get("failures")
            or result.evidence.get("cells")
        )
        assert kept, result.evidence

    def test_a_truncated_stream_keeps_the_partial_content(self, stub: StubFactory) -> None:
        url = stub("--fault", "truncate-stream")
        result = run_gate(url, Smoke())
        stream = next(r for r in result.evidence["requests"] if r["label"] == "stream")
        assert stream["result"]["truncated"] is True
        assert stream["result"]["done"] is False
        assert stream["result"]["usage"] is None

    def test_bad_tool_args_evidence_shows_expected_and_observed_arguments(self, stub: StubFactory) -> None:
        url = stub("--fault", "bad-tool-args")
        result = run_gate(url, Tools(count=2))
        wrong = [
            c for c in result.evidence["checks"] if c["classification"] == "bad_tool_args" and not c["ok"]
        ]
        assert len(wrong) == 2
        assert json.loads(wrong[0]["observed"]["arguments"]) != wrong[0]["expected"]["arguments"]
        assert result.summary == "0/2 exact"

    def test_thinking_records_both_directions(self, stub: StubFactory) -> None:
        url = stub("--fault", "reasoning-leak")
        result = run_gate(url, ThinkingControl())
        assert result.evidence["enabled"]["passed"] is True
        assert result.evidence["disabled"]["passed"] is False
        leaked = result.evidence["disabled"]["requests"][0]["result"]["content"]
        assert "<think>" in leaked


class TestCodingBudget:
    def test_a_cut_answer_is_budget_exhausted_not_wrong(self, stub: StubFactory) -> None:
        url = stub()
        result = run_gate(url, CodingAgent(repetitions=1, visible_tokens=8, tasks=["reverse-words"]))
        assert not result.passed
        assert result.classification == "visible_answer_budget_exhausted"
        row = result.evidence["results"][0]
        assert row["finish_reason"] == "length"
        assert row["classification"] == "visible_answer_budget_exhausted"
        assert row["content"]  # the cut answer is kept

    def test_the_same_suite_passes_at_the_full_budget(self, stub: StubFactory) -> None:
        url = stub()
        result = run_gate(url, CodingAgent(repetitions=1, visible_tokens=2048, tasks=["reverse-words"]))
        assert result.passed


class TestReserveGate:
    def test_passes_when_every_card_keeps_its_reserve(self) -> None:
        probe = lambda: [("GPU-aaaaaaaa-0000-0000-0000-000000000001", 3487, 3072)]  # noqa: E731
        result = run_gate("http://127.0.0.1:9", VramReserve(), reserve_probe=probe)
        assert result.passed and result.kind == "policy"

    def test_fails_as_policy_below_the_reserve(self) -> None:
        probe = lambda: [  # noqa: E731
            ("GPU-aaaaaaaa-0000-0000-0000-000000000001", 2101, 3072),
            ("GPU-aaaaaaaa-0000-0000-0000-000000000002", 4000, 3072),
        ]
        result = run_gate("http://127.0.0.1:9", VramReserve(), reserve_probe=probe)
        assert not result.passed
        assert result.kind == "policy"
        assert result.classification == "below_reserve"
        assert [c["ok"] for c in result.evidence["cards"]] == [False, True]
        assert result.evidence["cards"][0]["margin_mib"] == -971

    def test_without_a_probe_nothing_is_measured_and_it_fails(self) -> None:
        result = run_gate("http://127.0.0.1:9", VramReserve())
        assert not result.passed
        assert result.classification == "not_measured"

    def test_a_threshold_override_replaces_the_cards_reserve(self) -> None:
        probe = lambda: [("GPU-aaaaaaaa-0000-0000-0000-000000000001", 2101, 3072)]  # noqa: E731
        result = run_gate("http://127.0.0.1:9", VramReserve(reserve_mib=0), reserve_probe=probe)
        assert result.passed


class TestRunQualification:
    def test_stub_smoke_profile_is_verified_with_a_manifest(self, stub: StubFactory, tmp_path: Path) -> None:
        url = stub("--verbose-default")
        result = run_qualification(
            url,
            MODEL,
            load_profile("stub-smoke"),
            evidence_dir=tmp_path,
            tx_id="tx-good",
            identity_digest="d" * 64,
        )
        assert result.outcome == "verified", [g.name for g in result.gates if not g.passed]
        manifest = json.loads((tmp_path / "tx-good" / "manifest.json").read_text())
        names = {a["path"] for a in manifest["artifacts"]}
        assert "decision.json" in names and "00-served-identity.json" in names
        assert len(names) == len(result.gates) + 3  # the gates, summary, provenance, decision
        provenance = json.loads((tmp_path / "tx-good" / "provenance.json").read_text())
        assert (
            provenance["external_prior"] == []
            and "summary.json" in provenance["local_measurements"]["artifacts"]
        )
        decision = json.loads((tmp_path / "tx-good" / "decision.json").read_text())
        assert decision["identity_digest"] == "d" * 64
        assert [r.label for r in result.summary][:2] == ["4K", "4K C2"]
        assert json.dumps(result.as_dict())

    def test_a_reserve_failure_alone_is_policy_infeasible(self, stub: StubFactory, tmp_path: Path) -> None:
        url = stub()
        profile = load_profile("demo").select(["smoke", "vram_reserve"])
        result = run_qualification(
            url,
            MODEL,
            profile,
            evidence_dir=tmp_path,
            tx_id="tx-reserve",
            identity_digest="e" * 64,
            reserve_probe=lambda: [("GPU-aaaaaaaa-0000-0000-0000-000000000001", 2101, 3072)],
        )
        assert result.outcome == "policy-infeasible"

    def test_a_wrong_served_model_fails_before_any_gate(self, stub: StubFactory, tmp_path: Path) -> None:
        url = stub("--wrong-served-name", "impostor")
        result = run_qualification(
            url,
            MODEL,
            load_profile("smoke"),
            evidence_dir=tmp_path,
            tx_id="tx-wrong",
            identity_digest="f" * 64,
        )
        assert result.outcome == "failed"
        assert [g.name for g in result.gates] == ["served-identity"]
        assert result.gates[0].classification == "wrong_model"
        assert (tmp_path / "tx-wrong" / "00-served-identity.json").is_file()

    def test_an_unreachable_engine_is_recorded_not_raised(self, tmp_path: Path) -> None:
        result = run_qualification(
            f"http://127.0.0.1:{_free_port()}",
            MODEL,
            load_profile("smoke"),
            evidence_dir=tmp_path,
            tx_id="tx-down",
            identity_digest="a" * 64,
        )
        assert result.outcome == "failed"
        assert result.gates[0].classification == "error"
