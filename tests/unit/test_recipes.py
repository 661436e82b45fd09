"""Recipe model, loading, digest, slot fit and the container spec `load` creates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.config.host import HostConfig, Slot
from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import RecipeError
from anvil_ctl.recipes.model import Recipe, load_recipe, recipe_digest
from anvil_ctl.recipes.spec import check_fits_slot, check_runnable, container_spec

IMAGE_ID = "sha256:" + "a" * 64
DIGEST_REF = "ghcr.io/org/engine@sha256:" + "b" * 64
REVISION = "c3cbb9891b67c741bcbf6b176dd7af9265b069db"
UUID_A = "GPU-00000000-0000-4000-8000-00000000000a"
UUID_B = "GPU-00000000-0000-4000-8000-00000000000b"

BASE = """\
name = "{name}"
engine = "stub"
image = "{image}"
served_model = "served-x"
context_tokens = 4096
max_concurrency = 1
tp_size = 2
gpu_roles = ["compute-a", "compute-b"]
port = 8001
profile = "smoke"
entrypoint = ["/usr/bin/python3", "-m", "anvil_stub"]
args = ["--port", "8001"]
{extra}
[env]
PYTHONPATH = "/opt/anvil"

[[mounts]]
source = "../code/stub"
target = "/opt/anvil/anvil_stub"

[[mounts]]
source = "/usr"
target = "/usr"
read_only = true
"""


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[..., Path]:
    def write(name: str = "r1", image: str = IMAGE_ID, extra: str = "", text: str | None = None) -> Path:
        d = tmp_path / "recipes"
        d.mkdir(exist_ok=True)
        path = d / f"{name}.toml"
        path.write_text(text if text is not None else BASE.format(name=name, image=image, extra=extra))
        return path

    return write


@pytest.fixture
def host_config() -> HostConfig:
    return HostConfig.model_validate(
        {
            "gpu_roles": {
                "compute-a": {"uuid": UUID_A, "capacity_mib": 97887},
                "compute-b": {"uuid": UUID_B, "capacity_mib": 97887},
            },
            "slots": {
                "primary": {
                    "binding": "127.0.0.1:8001",
                    "router_tier": "primary-local",
                    "aliases": ["llm.primary"],
                    "gpu_roles": ["compute-a", "compute-b"],
                }
            },
        }
    )


def fields(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "r1",
        "engine": "stub",
        "image": IMAGE_ID,
        "served_model": "served-x",
        "context_tokens": 4096,
        "max_concurrency": 1,
        "tp_size": 2,
        "gpu_roles": ["compute-a", "compute-b"],
        "port": 8001,
        "profile": "smoke",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


class TestRecipeModel:
    def test_accepts_a_local_image_id_and_a_repo_digest(self) -> None:
        assert Recipe.model_validate(fields(image=IMAGE_ID)).image == IMAGE_ID
        assert Recipe.model_validate(fields(image=DIGEST_REF)).image == DIGEST_REF

    @pytest.mark.parametrize(
        "image",
        ["foo:latest", "foo", "ghcr.io/org/engine:v1", "sha256:abc", "foo@sha256:" + "A" * 64],
    )
    def test_refuses_an_image_that_is_not_pinned(self, image: str) -> None:
        with pytest.raises(ValueError, match="not pinned"):
            Recipe.model_validate(fields(image=image))

    def test_parses_a_pinned_model_identity(self) -> None:
        recipe = Recipe.model_validate(fields(engine="sglang", model=f"org/name@{REVISION}"))
        assert (recipe.model_repo, recipe.model) == ("org/name", f"org/name@{REVISION}")

    @pytest.mark.parametrize("model", ["org/name", "org/name@main", f"name@{REVISION}"])
    def test_refuses_a_model_without_a_40_hex_revision(self, model: str) -> None:
        with pytest.raises(ValueError, match="40 lowercase hex"):
            Recipe.model_validate(fields(engine="sglang", model=model))

    def test_a_stub_needs_no_model_but_another_engine_does(self) -> None:
        assert Recipe.model_validate(fields()).model is None
        with pytest.raises(ValueError, match="model: required"):
            Recipe.model_validate(fields(engine="sglang"))

    def test_a_missing_value_is_accepted_only_when_listed_as_unknown(self) -> None:
        with pytest.raises(ValueError, match="served_model: required"):
            Recipe.model_validate(fields(served_model=None))
        recipe = Recipe.model_validate(fields(served_model=None, unknown=["served_model"]))
        assert recipe.served_model is None
        assert not recipe.runnable

    def test_refuses_a_value_that_is_both_given_and_unknown(self) -> None:
        with pytest.raises(ValueError, match="given a value and listed as unknown"):
            Recipe.model_validate(fields(unknown=["served_model"]))

    def test_refuses_unknown_entries_that_name_no_field(self) -> None:
        with pytest.raises(ValueError, match="does not start with a recipe field"):
            Recipe.model_validate(fields(unknown=["flux_capacitor"]))

    def test_gpu_roles_must_match_tp_size_unless_a_reason_is_stated(self) -> None:
        with pytest.raises(ValueError, match="one role per rank"):
            Recipe.model_validate(fields(gpu_roles=["compute-a"]))
        stated = fields(gpu_roles=["compute-a"], gpu_roles_reason="both ranks share one card")
        assert Recipe.model_validate(stated).gpu_roles == ("compute-a",)

    def test_refuses_extra_fields(self) -> None:
        with pytest.raises(ValueError, match="extra"):
            Recipe.model_validate(fields(gpus="0,1"))

    def test_is_frozen(self) -> None:
        recipe = Recipe.model_validate(fields())
        with pytest.raises(ValueError, match="frozen"):
            recipe.port = 9000  # type: ignore[misc]

    def test_ulimits_take_one_number_or_soft_and_hard(self) -> None:
        recipe = Recipe.model_validate(
            fields(ulimits={"memlock": -1, "stack": {"soft": 67108864, "hard": 67108864}})
        )
        assert recipe.ulimit_tuples() == (("memlock", -1, -1), ("stack", 67108864, 67108864))


class TestLoadRecipe:
    def test_loads_a_valid_file(self, write_recipe: Callable[..., Path]) -> None:
        recipe = load_recipe(write_recipe())
        assert recipe.name == "r1"
        assert recipe.mounts[0].read_only is True

    def test_a_bare_tag_is_refused_naming_file_and_field(self, write_recipe: Callable[..., Path]) -> None:
        path = write_recipe(image="foo:latest")
        with pytest.raises(RecipeError) as info:
            load_recipe(path)
        message = str(info.value)
        assert str(path) in message
        assert ": image: " in message
        assert "sha256:<64 hex>" in message
        assert info.value.exit_code == 2

    def test_a_nested_error_names_the_dotted_field(self, write_recipe: Callable[..., Path]) -> None:
        text = BASE.format(name="r1", image=IMAGE_ID, extra="").replace('target = "/usr"', 'target = "usr"')
        with pytest.raises(RecipeError, match=r"mounts\.1\.target: .*absolute path"):
            load_recipe(write_recipe(text=text))

    def test_the_name_must_equal_the_file_name(self, write_recipe: Callable[..., Path]) -> None:
        path = write_recipe(name="r1")
        renamed = path.with_name("other.toml")
        path.rename(renamed)
        with pytest.raises(RecipeError, match="name: 'r1' differs from the file name; expected 'other'"):
            load_recipe(renamed)

    def test_a_missing_file_is_a_recipe_error(self, tmp_path: Path) -> None:
        with pytest.raises(RecipeError, match="recipe not found"):
            load_recipe(tmp_path / "absent.toml")

    def test_invalid_toml_is_a_recipe_error(self, write_recipe: Callable[..., Path]) -> None:
        with pytest.raises(RecipeError, match="not valid TOML"):
            load_recipe(write_recipe(text="name = [unclosed"))


class TestRecipeDigest:
    def test_is_stable_and_changes_with_any_value(self, write_recipe: Callable[..., Path]) -> None:
        a = load_recipe(write_recipe())
        b = load_recipe(write_recipe())
        assert recipe_digest(a) == recipe_digest(b)
        assert len(recipe_digest(a)) == 64
        changed = Recipe.model_validate({**a.model_dump(), "context_tokens": 8192})
        assert recipe_digest(changed) != recipe_digest(a)

    def test_does_not_depend_on_the_file_location(self, tmp_path: Path) -> None:
        text = BASE.format(name="r1", image=IMAGE_ID, extra="")
        for d in ("one", "two"):
            (tmp_path / d).mkdir()
            (tmp_path / d / "r1.toml").write_text(text)
        assert recipe_digest(load_recipe(tmp_path / "one/r1.toml")) == recipe_digest(
            load_recipe(tmp_path / "two/r1.toml")
        )


class TestCheckRunnable:
    def test_refuses_a_recipe_with_unknown_values_naming_them(self) -> None:
        recipe = Recipe.model_validate(fields(served_model=None, unknown=["served_model", "args.x"]))
        with pytest.raises(RecipeError, match=r"unknown: served_model, args\.x"):
            check_runnable(recipe)

    def test_accepts_a_fully_known_recipe(self) -> None:
        check_runnable(Recipe.model_validate(fields()))


class TestCheckFitsSlot:
    def test_refuses_a_port_that_differs_from_the_binding(self, host_config: HostConfig) -> None:
        recipe = Recipe.model_validate(fields(port=8002))
        with pytest.raises(RecipeError, match=r"port: 8002 differs .*127\.0\.0\.1:8001; expected 8001"):
            check_fits_slot(recipe, host_config.slot("primary"))

    def test_refuses_gpu_roles_the_slot_does_not_allow(self) -> None:
        slot = Slot(
            binding="127.0.0.1:8001",
            router_tier="t",
            aliases=("a",),
            gpu_roles=("compute-a",),
        )
        with pytest.raises(RecipeError, match=r"gpu_roles: \['compute-b'\] are not allowed"):
            check_fits_slot(Recipe.model_validate(fields()), slot)

    def test_accepts_a_recipe_that_fits(self, host_config: HostConfig) -> None:
        check_fits_slot(Recipe.model_validate(fields()), host_config.slot("primary"))


class TestContainerSpec:
    def spec(self, path: Path, host_config: HostConfig, tx_id: str = "3f2a9c1e-77aa-4bcd") -> Any:
        return container_spec(
            load_recipe(path),
            slot_name="primary",
            slot=host_config.slot("primary"),
            host_config=host_config,
            recipe_path=path,
            tx_id=tx_id,
        )

    def test_names_the_container_by_slot_recipe_and_short_transaction(
        self, write_recipe: Callable[..., Path], host_config: HostConfig
    ) -> None:
        assert self.spec(write_recipe(), host_config).name == "anvil-primary-r1-3f2a9c1e"

    def test_labels_mark_a_managed_candidate_of_this_recipe_and_transaction(
        self, write_recipe: Callable[..., Path], host_config: HostConfig
    ) -> None:
        path = write_recipe()
        labels = dict(self.spec(path, host_config).labels)
        assert labels == {
            "io.anvil.managed": "true",
            "io.anvil.slot": "primary",
            "io.anvil.recipe": "r1",
            "io.anvil.recipe-digest": recipe_digest(load_recipe(path)),
            "io.anvil.transaction": "3f2a9c1e-77aa-4bcd",
            "io.anvil.served-model": "served-x",
            "io.anvil.role": "candidate",
        }

    def test_pins_gpus_by_uuid_from_the_host_config(
        self, write_recipe: Callable[..., Path], host_config: HostConfig
    ) -> None:
        assert self.spec(write_recipe(), host_config).gpu_uuids == (UUID_A, UUID_B)

    def test_resolves_a_relative_mount_source_against_the_recipe_directory(
        self, write_recipe: Callable[..., Path], host_config: HostConfig, tmp_path: Path
    ) -> None:
        mounts = self.spec(write_recipe(), host_config).mounts
        assert mounts[0].source == str(tmp_path / "code" / "stub")
        assert mounts[0].target == "/opt/anvil/anvil_stub"
        assert mounts[1].source == "/usr"

    def test_carries_image_command_env_host_network_and_init(
        self, write_recipe: Callable[..., Path], host_config: HostConfig
    ) -> None:
        spec = self.spec(write_recipe(image=DIGEST_REF), host_config)
        assert spec.image == DIGEST_REF
        assert spec.entrypoint == ("/usr/bin/python3", "-m", "anvil_stub")
        assert spec.command == ("--port", "8001")
        assert dict(spec.env) == {"PYTHONPATH": "/opt/anvil"}
        assert spec.network_mode == "host"
        assert spec.ports == ()
        assert spec.init is True

    def test_refuses_a_role_missing_from_the_host_config(self, write_recipe: Callable[..., Path]) -> None:
        config = HostConfig.model_validate(
            {
                "gpu_roles": {"compute-a": {"uuid": UUID_A, "capacity_mib": 97887}},
                "slots": {
                    "primary": {
                        "binding": "127.0.0.1:8001",
                        "router_tier": "t",
                        "aliases": ["a"],
                    }
                },
            }
        )
        with pytest.raises(RecipeError, match="role 'compute-b' is not in the host config"):
            self.spec(write_recipe(), config)

    def test_refuses_a_port_mismatch_before_building_anything(
        self, write_recipe: Callable[..., Path], host_config: HostConfig
    ) -> None:
        text = BASE.format(name="r1", image=IMAGE_ID, extra="").replace("port = 8001", "port = 9000")
        with pytest.raises(RecipeError, match="port: 9000"):
            self.spec(write_recipe(text=text), host_config)


SOURCE = {
    "repository": "github.com/org/engine",
    "release": "v0.1.1-rc.14",
    "commit": "a547c90c74f1363920287eb80adc88a16d1e7005",
    "image_tag": "ghcr.io/org/engine:v0.1.1-rc.14",
    "image_digest": "sha256:" + "b" * 64,
    "external_prior": [
        {"figure": "~8,100 tok/s prefill", "conditions": "native Linux", "where": "release notes"}
    ],
}


class TestRecipeSource:
    def test_a_recipe_may_carry_its_upstream_source_with_external_figures(self) -> None:
        r = Recipe.model_validate(fields(image=DIGEST_REF, source=SOURCE))
        assert r.source is not None and r.source.release == "v0.1.1-rc.14"
        assert r.source.external_prior[0].figure == "~8,100 tok/s prefill"

    def test_a_published_digest_that_differs_from_the_pinned_image_is_refused(self) -> None:
        other = SOURCE | {"image_digest": "sha256:" + "e" * 64}
        with pytest.raises(ValueError, match=r"source\.image_digest"):
            Recipe.model_validate(fields(image=DIGEST_REF, source=other))

    @pytest.mark.parametrize(("key", "value"), [("commit", "main"), ("image_digest", "v1")])
    def test_a_malformed_commit_or_digest_is_refused(self, key: str, value: str) -> None:
        with pytest.raises(ValueError, match=key):
            Recipe.model_validate(fields(source=SOURCE | {key: value}))

    def test_an_external_figure_must_say_where_it_was_published(self) -> None:
        with pytest.raises(ValueError, match="where"):
            Recipe.model_validate(fields(source={"external_prior": [{"figure": "fast"}]}))

    def test_a_recipe_without_a_source_keeps_its_digest(self) -> None:
        plain = Recipe.model_validate(fields())
        assert "source" not in plain.model_fields_set
        # What the digest was before `source`, `vram_need_mib` and the engine profile's fields:
        # `health_path` then defaulted to "/health" (the stub's profile's path) and entered.
        later = ("source", "vram_need_mib", "engine_profile", "model_files", "model_mount")
        expected = {k: v for k, v in plain.model_dump(mode="json").items() if k not in later}
        assert plain.health_path is None and plain.effective_health_path == "/health"
        assert recipe_digest(plain) == sha256_hex(expected | {"health_path": "/health"})
        assert recipe_digest(Recipe.model_validate(fields(source=SOURCE))) != recipe_digest(plain)
