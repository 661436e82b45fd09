"""Qualification against the stub engine in real containers (scripts/testenv).

The containers get the repo's fixtures directory bind-mounted read-only so the
stub can read the coding answer book, as a deployed stub recipe would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.core.errors import NotFound
from anvil_ctl.core.model import ContainerSpec, Mount
from anvil_ctl.evidence.bundle import Redaction, export_bundle, verify_bundle
from anvil_ctl.qualify.gates.base import FIXTURES_DIR
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.runner import QualificationResult, run_qualification
from tests.integration.conftest import find_free_port, wait_healthy

MODEL = "qual-stub"
CONTAINER_FIXTURES = "/opt/anvil/anvil_ctl/fixtures"
GPU = "GPU-5e1f0000-aaaa-bbbb-cccc-000000000001"
CAPACITY_MIB = 32768

QualStub = Callable[..., str]


@pytest.fixture
def qual_stub(runtime: Any, stub_spec: Callable[..., ContainerSpec]) -> Iterator[QualStub]:
    """Factory: a stub container with the answer book; returns its base URL."""
    created: list[str] = []

    def make(*extra: str, gpu_uuids: Sequence[str] = ()) -> str:
        port = find_free_port()
        spec = stub_spec(
            served_model=MODEL,
            port=port,
            extra_args=(
                "--answer-book",
                f"{CONTAINER_FIXTURES}/coding_answer_book.json",
                "--verbose-default",
                *extra,
            ),
            gpu_uuids=gpu_uuids,
        )
        spec = dataclasses.replace(spec, mounts=(*spec.mounts, Mount(str(FIXTURES_DIR), CONTAINER_FIXTURES)))
        container_id = runtime.create(spec)
        created.append(container_id)
        runtime.start(container_id)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, container_id, runtime)
        return url

    yield make
    for container_id in reversed(created):
        with contextlib.suppress(NotFound):
            runtime.remove(container_id, force=True)


def qualify(
    url: str, profile: str, tmp_path: Path, tx: str, gates: list[str] | None = None, **kw: Any
) -> QualificationResult:
    loaded = load_profile(profile)
    if gates:
        loaded = loaded.select(gates)
    return run_qualification(
        url,
        MODEL,
        loaded,
        evidence_dir=tmp_path / "evidence",
        tx_id=tx,
        identity_digest="c" * 64,
        **kw,
    )


def artifact(result: QualificationResult, gate: str) -> dict[str, Any]:
    found = result.artifact_for(gate)
    assert found is not None
    data: dict[str, Any] = json.loads((Path(result.tx_dir) / found.path).read_text())
    return data


class TestGoodStubContainer:
    def test_stub_smoke_is_verified_and_its_export_verifies_until_a_byte_changes(
        self, qual_stub: QualStub, tmp_path: Path
    ) -> None:
        url = qual_stub()
        result = qualify(url, "stub-smoke", tmp_path, "tx-good")
        assert result.outcome == "verified", [(g.name, g.classification) for g in result.gates]
        assert all(g.passed for g in result.gates)
        assert {r.label for r in result.summary} >= {"4K", "16K", "4K endurance C2"}
        assert verify_bundle(Path(result.tx_dir)).ok

        bundle = tmp_path / "bundle"
        export_bundle(Path(result.tx_dir), bundle, redact=Redaction(secrets=("never-logged",)))
        assert verify_bundle(bundle).ok
        assert str(tmp_path) not in "".join(p.read_text() for p in bundle.iterdir())
        target = bundle / "03-tools.json"
        data = bytearray(target.read_bytes())
        data[10] ^= 0x20
        target.write_bytes(bytes(data))
        problems = [(m.path, m.problem) for m in verify_bundle(bundle).mismatches]
        assert problems == [("03-tools.json", "sha256")]

    def test_the_reserve_probe_turns_a_full_card_into_policy_infeasible(
        self, qual_stub: QualStub, tmp_path: Path
    ) -> None:
        url = qual_stub("--vram-idle-mib", "20000", "--vram-loaded-mib", "30000", gpu_uuids=[GPU])

        def probe() -> list[tuple[str, int, int]]:
            used = httpx.get(url + "/anvil/sim/vram", timeout=5).json()["gpus"]
            return [(uuid, CAPACITY_MIB - mib, 3072) for uuid, mib in used.items()]

        result = qualify(
            url,
            "demo",
            tmp_path,
            "tx-reserve",
            gates=["smoke", "vram_reserve"],
            reserve_probe=probe,
        )
        assert result.outcome == "policy-infeasible"
        cards = artifact(result, "vram_reserve")["evidence"]["cards"]
        assert cards == [
            {"uuid": GPU, "free_mib": 2768, "reserve_mib": 3072, "ok": False, "margin_mib": -304}
        ]
        bundle = tmp_path / "bundle"
        export_bundle(Path(result.tx_dir), bundle)
        assert GPU not in (bundle / "02-vram_reserve.json").read_text()


BROKEN = [
    ("bad-tool-args", ["tools", "long_context_tool", "streaming_tool"], "bad_tool_args"),
    ("reasoning-leak", ["thinking"], "reasoning_leak"),
    ("truncate-stream", ["streaming_tool", "capacity"], None),
    ("bad-json", ["json"], "bad_json"),
]


class TestBrokenStubContainer:
    @pytest.mark.parametrize(("fault", "gates", "classification"), BROKEN, ids=[b[0] for b in BROKEN])
    def test_the_broken_gates_fail_and_their_evidence_is_kept(
        self,
        qual_stub: QualStub,
        tmp_path: Path,
        fault: str,
        gates: list[str],
        classification: str | None,
    ) -> None:
        url = qual_stub("--fault", fault)
        result = qualify(url, "stub-smoke", tmp_path, f"tx-{fault}", gates=["smoke", *gates])
        assert result.outcome == "failed"
        by_name = {g.name: g for g in result.gates}
        for gate in gates:
            assert not by_name[gate].passed, gate
            if classification:
                assert by_name[gate].classification == classification
            kept = artifact(result, gate)
            assert kept["passed"] is False and kept["evidence"], gate
        assert verify_bundle(Path(result.tx_dir)).ok

    def test_a_truncated_stream_is_never_counted_as_completed(
        self, qual_stub: QualStub, tmp_path: Path
    ) -> None:
        url = qual_stub("--fault", "truncate-stream")
        result = qualify(url, "stub-smoke", tmp_path, "tx-trunc", gates=["endurance"])
        evidence = artifact(result, "endurance")["evidence"]
        assert evidence["completed"] == 0
        assert len(evidence["failures"]) == evidence["requests"] == 12
        assert {f["failure"] for f in evidence["failures"]} == {"truncated_stream"}

    def test_budget_exhaustion_is_classified_not_called_wrong(
        self, qual_stub: QualStub, tmp_path: Path
    ) -> None:
        url = qual_stub()
        profile = tmp_path / "tight.toml"
        profile.write_text('[[gates]]\ntype = "coding"\nrepetitions = 1\nvisible_tokens = 8\n')
        result = run_qualification(
            url,
            MODEL,
            load_profile(profile),
            evidence_dir=tmp_path,
            tx_id="tx-budget",
            identity_digest="b" * 64,
        )
        coding = result.gates[-1]
        assert result.outcome == "failed"
        assert coding.classification == "visible_answer_budget_exhausted"
        rows = coding.evidence["results"]
        assert {r["classification"] for r in rows} == {"visible_answer_budget_exhausted"}
        assert all(r["finish_reason"] == "length" for r in rows)
