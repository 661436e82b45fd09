"""scripts/gpu_story.py's judgement without a GPU: a recorded VRAM figure against the
nvidia-smi samples of its window, and the CUDA recipes made from the CPU ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.recipes.model import load_recipe
from scripts.gpu_story import CANDIDATE, INCUMBENT, Sample, Story, render_recipe

UUID = "GPU-7d35cb71-54bc-05dd-6543-82a7e26a127b"


class Samples:
    """nvidia-smi's lines as SmiSampler keeps them, without the process."""

    def __init__(self, *samples: Sample) -> None:
        self.samples = list(samples)

    def window(self, uuid: str, t0: float, t1: float) -> list[Sample]:
        return [s for s in self.samples if s.uuid == uuid.lower() and t0 <= s.t <= t1]


def story(*samples: Sample) -> Story:
    return Story(Samples(*samples), uuid=UUID)  # type: ignore[arg-type]


def at(t: float, used: int) -> Sample:
    return Sample(t, UUID.lower(), used, 143_155 - used)


class TestCompare:
    def test_the_sample_nearest_the_windows_middle_judges_the_figure(self) -> None:
        s = story(at(99.0, 0), at(100.45, 936), at(100.9, 0), at(102.0, 936))
        s.compare("after adopt", "used", 937, 100.0, 101.0)
        (row,) = s.vram
        assert (row["nvidia_smi"], row["diff"], row["ok"]) == (936, 1, True)
        assert row["smi_range_in_window"] == [0, 936] and row["samples"] == 2

    def test_two_mib_apart_fails(self) -> None:
        s = story(at(100.5, 936))
        s.compare("after adopt", "free", 143_155 - 938, 100.0, 101.0)
        assert [c["ok"] for c in s.checks] == [False]
        assert s.vram[0]["diff"] == -2

    def test_no_sample_in_the_window_is_a_failed_check_not_a_pass(self) -> None:
        s = story(at(90.0, 0), at(110.0, 0))
        s.compare("release-vram", "free", 143_155, 100.0, 101.0)
        assert s.vram == []
        assert [c["ok"] for c in s.checks] == [False]
        assert "no nvidia-smi sample" in s.checks[0]["what"]


class TestRecipes:
    @pytest.mark.parametrize(("context", "name"), [(2048, INCUMBENT), (8192, CANDIDATE)])
    def test_the_cpu_recipe_becomes_the_cuda_engines(self, tmp_path: Path, context: int, name: str) -> None:
        path = tmp_path / f"{name}.toml"
        path.write_text(render_recipe(context, "sha256:" + "c" * 64, 1216, "d" * 64, "measured here"))
        recipe = load_recipe(path)
        cpu = load_recipe(
            Path(__file__).resolve().parents[2] / "recipes" / f"llama-smollm2-{context // 1024}k.toml"
        )
        assert recipe.profile_of_engine.name == "llama-cpp-python-cuda"
        assert (recipe.image, recipe.vram_need_mib, recipe.gpu_roles) == (
            "sha256:" + "c" * 64,
            1216,
            ("compute-a",),
        )
        assert list(recipe.args) == [*cpu.args[:10], "--n_gpu_layers", "-1", *cpu.args[10:]]
        assert (recipe.model, recipe.context_tokens, recipe.served_model) == (
            cpu.model,
            cpu.context_tokens,
            cpu.served_model,
        )
        assert recipe.provenance["engine_wheel_sha256"] == "d" * 64
        assert "# vram_need_mib: measured here" in path.read_text()
