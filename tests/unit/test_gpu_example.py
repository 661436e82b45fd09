"""The GPU run's evidence, kept in docs/examples/ because CI has no GPU: the bundle verifies
against the manifest digest published in docs/examples/README.md, on a host without the
state database, and it, the run's record and the recipes it wrote say the same things."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.core.states import ExitCode
from anvil_ctl.recipes.model import load_recipe
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
BUNDLE = EXAMPLES / "llama-cuda-h200"
STORY = EXAMPLES / "gpu-story-h200.json"


def published_digest() -> str:
    """The --expect-manifest that docs/examples/README.md gives for the GPU bundle."""
    text = (EXAMPLES / "README.md").read_text()
    found = re.search(
        r"anvilctl evidence verify docs/examples/llama-cuda-h200 \\\s+--expect-manifest ([0-9a-f]{64})", text
    )
    assert found, "docs/examples/README.md publishes no manifest digest for llama-cuda-h200"
    return found.group(1)


def artifact(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BUNDLE / name).read_text())
    return data


@pytest.fixture
def story() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(STORY.read_text())
    return data


class TestTheBundle:
    @pytest.fixture
    def anvilctl(
        self,
        fake_host: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> Run:
        run = in_process(fake_host, monkeypatch, capsys)
        monkeypatch.setenv("ANVIL_STATE_DIR", str(tmp_path / "no-state"))  # as on a reader's machine
        return run

    def test_it_verifies_against_the_published_manifest_digest(self, anvilctl: Run) -> None:
        r = anvilctl("evidence", "verify", str(BUNDLE), "--expect-manifest", published_digest(), "--json")
        assert r.code == ExitCode.OK, r.out
        assert ("--expect-manifest", True) in [(b["against"], b["matched"]) for b in r.json()["bindings"]]

    def test_another_digest_does_not_vouch_for_it(self, anvilctl: Run) -> None:
        r = anvilctl("evidence", "verify", str(BUNDLE), "--expect-manifest", "0" * 64, "--json")
        assert r.code == ExitCode.DRIFT
        assert ("--expect-manifest", False) in [(b["against"], b["matched"]) for b in r.json()["bindings"]]

    def test_it_holds_real_gpu_readings_with_the_uuid_redacted(self) -> None:
        identity = artifact("identity.json")
        assert identity["engine_profile"] == "llama-cpp-python-cuda"
        assert identity["gpu_role_uuids"] == {"compute-a": "GPU-REDACTED-1"}
        before = artifact("vram-before.json")["cards"]
        after = artifact("08-vram_reserve.json")["evidence"]["cards"]
        assert [c["uuid"] for c in before + after] == ["GPU-REDACTED-1", "GPU-REDACTED-1"]
        # the engine took memory during the workload, and the reserve held after it
        assert after[0]["free_mib"] < before[0]["free_mib"]
        assert after[0]["ok"] and after[0]["free_mib"] >= after[0]["reserve_mib"]
        assert not re.search(r"GPU-[0-9a-f]{8}-", "".join(p.read_text() for p in BUNDLE.iterdir()))

    def test_the_log_audit_judged_the_cuda_engines_log_and_found_nothing_fatal(self) -> None:
        audit = artifact("09-log_audit.json")
        assert audit["passed"]
        assert audit["evidence"]["patterns"]["engine"] == "llama-cpp-python-cuda"
        assert audit["evidence"]["fatal_lines"] == []
        assert audit["evidence"]["lines"] > 1000


class TestTheRunsRecord:
    def test_every_check_passed_and_every_vram_figure_is_within_1_mib_of_nvidia_smi(
        self, story: dict[str, Any]
    ) -> None:
        assert [c["what"] for c in story["checks"] if not c["ok"]] == []
        assert len(story["vram"]) >= 10
        assert all(abs(v["recorded"] - v["nvidia_smi"]) <= 1 for v in story["vram"])
        assert story["facts"]["gpu"]["name"] == "NVIDIA H200"
        assert story["facts"]["docker_gpu_mode"] == "devices"

    def test_the_engine_took_and_released_its_memory(self, story: dict[str, Any]) -> None:
        for measured in story["facts"]["measured"].values():
            assert measured["held_mib"] > 100
            assert measured["release_after_exit_s"] < 1.0
        for label in ("load_release", "rollback_release"):
            release = story["facts"][label]
            assert release["smi_held_during_stop_mib"] > 100
            assert release["smi_idle_after_stop_began_s"] is not None

    def test_the_bundle_is_the_qualification_the_record_exported(self, story: dict[str, Any]) -> None:
        assert story["facts"]["manifest_sha256"] == published_digest()
        assert artifact("identity.json")["container_id"] == story["facts"]["candidate"]


class TestTheRecipesItWrote:
    @pytest.mark.parametrize(
        ("name", "context"), [("llama-smollm2-cuda-2k", 2048), ("llama-smollm2-cuda-8k", 8192)]
    )
    def test_they_pin_the_runs_image_and_its_measured_need(
        self, story: dict[str, Any], name: str, context: int
    ) -> None:
        recipe = load_recipe(REPO / "recipes" / f"{name}.toml")
        assert recipe.profile_of_engine.name == "llama-cpp-python-cuda"
        assert recipe.gpu_roles == ("compute-a",)
        assert recipe.image == artifact("identity.json")["image_id"]
        assert recipe.vram_need_mib == story["facts"]["measured"][str(context)]["need_mib"]
        assert recipe.vram_need_mib >= story["facts"]["measured"][str(context)]["held_mib"]
        assert "--n_gpu_layers" in recipe.args
