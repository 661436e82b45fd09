"""`recipes list|show|validate|plan` as library functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.commands.recipes import (
    RecipeDir,
    list_recipes,
    plan_recipe,
    resolve_recipe_path,
    show_recipe,
    validate_recipe,
)
from anvil_ctl.config.host import HostConfig
from anvil_ctl.core.errors import ConfigError, RecipeError
from anvil_ctl.core.model import config_fingerprint
from anvil_ctl.recipes.model import load_recipe, recipe_digest
from anvil_ctl.recipes.spec import container_spec

IMAGE_ID = "sha256:" + "a" * 64
UUID_A = "GPU-00000000-0000-4000-8000-00000000000a"

GOOD = f"""\
name = "good"
engine = "stub"
image = "{IMAGE_ID}"
served_model = "served-good"
context_tokens = 4096
max_concurrency = 1
tp_size = 1
gpu_roles = ["compute-a"]
port = 8001
profile = "smoke"
args = ["--port", "8001"]
"""


def given(directory: Path) -> list[RecipeDir]:
    """A recipe search of one directory."""
    return [RecipeDir(directory, "given")]


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "good.toml").write_text(GOOD)
    (d / "tagged.toml").write_text(GOOD.replace('"good"', '"tagged"').replace(IMAGE_ID, "engine:latest"))
    (d / "README.md").write_text("not a recipe")
    return d


@pytest.fixture
def host_config() -> HostConfig:
    return HostConfig.model_validate(
        {
            "gpu_roles": {"compute-a": {"uuid": UUID_A, "capacity_mib": 97887}},
            "slots": {
                "primary": {
                    "binding": "127.0.0.1:8001",
                    "router_tier": "primary-local",
                    "aliases": ["llm.primary"],
                    "gpu_roles": ["compute-a"],
                },
                "secondary": {
                    "binding": "127.0.0.1:8002",
                    "router_tier": "secondary-local",
                    "aliases": ["llm.secondary"],
                },
            },
        }
    )


class TestResolveRecipePath:
    def test_finds_a_recipe_by_name_or_by_path(self, recipes_dir: Path) -> None:
        assert resolve_recipe_path("good", given(recipes_dir)) == recipes_dir / "good.toml"
        path = recipes_dir / "good.toml"
        assert resolve_recipe_path(str(path), given(recipes_dir)) == path

    def test_an_unknown_name_lists_the_known_ones(self, recipes_dir: Path) -> None:
        with pytest.raises(RecipeError, match=r"'absent' not found .*\['good', 'tagged'\]"):
            resolve_recipe_path("absent", given(recipes_dir))


class TestListRecipes:
    def test_lists_every_toml_with_valid_ones_summarised_and_invalid_ones_explained(
        self, recipes_dir: Path
    ) -> None:
        rows = list_recipes(given(recipes_dir))
        assert [(r["name"], r["valid"]) for r in rows] == [("good", True), ("tagged", False)]
        good, tagged = rows
        assert good["served_model"] == "served-good"
        assert good["digest"] == recipe_digest(load_recipe(recipes_dir / "good.toml"))
        assert good["runnable"]
        assert "image" in str(tagged["error"])

    def test_a_missing_directory_is_a_recipe_error(self, tmp_path: Path) -> None:
        with pytest.raises(RecipeError, match="recipes directory not found"):
            list_recipes(given(tmp_path / "nowhere"))


class TestShowRecipe:
    def test_returns_the_recipe_as_data_with_its_digest(self, recipes_dir: Path) -> None:
        view = show_recipe("good", given(recipes_dir))
        assert view.recipe["served_model"] == "served-good"
        assert view.digest == recipe_digest(load_recipe(recipes_dir / "good.toml"))


class TestValidateRecipe:
    def test_passes_a_valid_recipe(self, recipes_dir: Path) -> None:
        report = validate_recipe("good", given(recipes_dir))
        assert (report.name, report.runnable, report.checked_slot) == ("good", True, None)

    def test_an_unpinned_image_raises_with_exit_code_2_naming_the_field(self, recipes_dir: Path) -> None:
        with pytest.raises(RecipeError) as info:
            validate_recipe("tagged", given(recipes_dir))
        assert info.value.exit_code == 2
        assert "tagged.toml: image: " in str(info.value)

    def test_with_a_slot_checks_the_port_against_the_binding(
        self, recipes_dir: Path, host_config: HostConfig
    ) -> None:
        assert (
            validate_recipe(
                "good", given(recipes_dir), host_config=host_config, slot_name="primary"
            ).checked_slot
            == "primary"
        )
        with pytest.raises(RecipeError, match="port: 8001 differs"):
            validate_recipe("good", given(recipes_dir), host_config=host_config, slot_name="secondary")

    def test_an_unknown_slot_is_a_config_error(self, recipes_dir: Path, host_config: HostConfig) -> None:
        with pytest.raises(ConfigError, match="slot 'nope'"):
            validate_recipe("good", given(recipes_dir), host_config=host_config, slot_name="nope")


class TestPlanRecipe:
    def test_returns_exactly_the_spec_load_would_create(
        self, recipes_dir: Path, host_config: HostConfig
    ) -> None:
        path = recipes_dir / "good.toml"
        plan = plan_recipe("good", given(recipes_dir), host_config=host_config, slot_name="primary")
        expected = container_spec(
            load_recipe(path),
            slot_name="primary",
            slot=host_config.slot("primary"),
            host_config=host_config,
            recipe_path=path,
            tx_id="planned",
        )
        assert plan.spec["name"] == expected.name == "anvil-primary-good-planned"
        assert plan.spec["gpu_uuids"] == [UUID_A]
        assert plan.spec["labels"] == dict(expected.labels)
        assert plan.spec["command"] == ["--port", "8001"]
        assert plan.config_fingerprint == config_fingerprint(expected.fingerprint_fields())

    def test_touches_nothing_on_disk(
        self, recipes_dir: Path, host_config: HostConfig, tmp_path: Path
    ) -> None:
        before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
        plan_recipe("good", given(recipes_dir), host_config=host_config, slot_name="primary")
        assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
