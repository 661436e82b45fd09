"""The recipes shipped in recipes/: they validate, plan, and carry the seeds' figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from anvil_ctl.commands.recipes import RecipeDir, list_recipes, plan_recipe
from anvil_ctl.config.host import HostConfig
from anvil_ctl.recipes.model import Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
SEARCH = [RecipeDir(RECIPES, "shipped")]
CARD_MIB = 97887
STUBS = ("stub-incumbent-524k", "stub-499k-c4", "stub-393k-c1", "stub-245k-c1")
SEEDS = (
    "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix",
    "glm53-flash-ormandj-sglang-sm120-tp2-240k-c1-adaptive-mtp",
    "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp",
    "glm53-flash-ormandj-sglang-sm120-tp2-499k-c4-adaptive-mtp",
)
GLM_MODEL = "ormandj/GLM-5.3-Flash-W4A16-NVFP4-K32-Experts-FP8-WO@c3cbb9891b67c741bcbf6b176dd7af9265b069db"
SGLANG_IMAGE = (
    "ghcr.io/ormandj/sglang-glm53-flash-sm120"
    "@sha256:0c0637959c3931829f05154087bbefd2c50003fb9b2010200ce0ec82f4d71a53"
)


@pytest.fixture
def host_config() -> HostConfig:
    """The host config the stub recipes assume (two simulated 97,887 MiB cards)."""
    role = {"capacity_mib": CARD_MIB, "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q (simulated)"}
    return HostConfig.model_validate(
        {
            "gpu_roles": {
                "compute-a": {**role, "uuid": "GPU-00000000-0000-4000-8000-00000000000a"},
                "compute-b": {**role, "uuid": "GPU-00000000-0000-4000-8000-00000000000b"},
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


def recipe(name: str) -> Recipe:
    return load_recipe(RECIPES / f"{name}.toml")


def arg(r: Recipe, flag: str) -> str:
    return r.args[r.args.index(flag) + 1]


class TestShippedRecipes:
    def test_every_shipped_recipe_is_valid(self) -> None:
        rows = list_recipes(SEARCH)
        assert {r["name"] for r in rows} >= {*STUBS, *SEEDS}
        assert [r["error"] for r in rows if not r["valid"]] == []

    @pytest.mark.parametrize("name", STUBS + SEEDS)
    def test_every_shipped_recipe_plans_in_the_primary_slot(self, name: str, host_config: HostConfig) -> None:
        plan = plan_recipe(name, SEARCH, host_config=host_config, slot_name="primary")
        assert plan.spec["network_mode"] == "host"
        assert len(plan.spec["gpu_uuids"]) == 2


class TestStubRecipes:
    @pytest.mark.parametrize("name", STUBS)
    def test_are_runnable_and_serve_their_name_on_the_slot_port(self, name: str) -> None:
        r = recipe(name)
        assert r.runnable
        assert r.engine == "stub"
        assert r.entrypoint == ("/usr/bin/python3", "-m", "anvil_stub")
        assert arg(r, "--port") == "8001" == str(r.port)
        assert arg(r, "--served-model") == r.served_model
        assert int(arg(r, "--max-model-len")) == r.context_tokens
        assert r.env == {"PYTHONPATH": "/opt/anvil"}

    @pytest.mark.parametrize("name", STUBS)
    def test_mount_the_hosts_python_the_stub_package_and_its_fixtures_read_only(
        self, name: str, host_config: HostConfig
    ) -> None:
        plan = plan_recipe(name, SEARCH, host_config=host_config, slot_name="primary")
        mounts = {m["target"]: m for m in plan.spec["mounts"]}
        assert set(mounts) == {
            "/usr",
            "/lib",
            "/lib64",
            "/opt/anvil/anvil_stub",
            "/opt/anvil/anvil_ctl/fixtures",
        }
        assert all(m["read_only"] for m in mounts.values())
        assert mounts["/opt/anvil/anvil_stub"]["source"] == str(ROOT / "anvil_stub")
        # The answer book gives the coding-agent gates their ground truth.
        assert mounts["/opt/anvil/anvil_ctl/fixtures"]["source"] == str(ROOT / "anvil_ctl" / "fixtures")

    @pytest.mark.parametrize(
        ("name", "served", "context", "concurrency"),
        [
            (
                "stub-incumbent-524k",
                "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix",
                524288,
                1,
            ),
            (
                "stub-499k-c4",
                "glm53-flash-ormandj-sglang-sm120-tp2-499k-c4-adaptive-mtp",
                499712,
                4,
            ),
            (
                "stub-393k-c1",
                "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp",
                393216,
                1,
            ),
            (
                "stub-245k-c1",
                "glm53-flash-ormandj-sglang-sm120-tp2-240k-c1-adaptive-mtp",
                245760,
                1,
            ),
        ],
    )
    def test_carry_the_seeds_served_names_contexts_and_concurrency(
        self, name: str, served: str, context: int, concurrency: int
    ) -> None:
        r = recipe(name)
        assert (r.served_model, r.context_tokens, r.max_concurrency) == (
            served,
            context,
            concurrency,
        )

    @pytest.mark.parametrize(
        ("name", "free_idle", "free_loaded"),
        [("stub-393k-c1", 3351, 2101), ("stub-245k-c1", 4733, 3487), ("stub-499k-c4", 49, 49)],
    )
    def test_simulated_vram_leaves_the_seeds_free_mib(
        self, name: str, free_idle: int, free_loaded: int
    ) -> None:
        r = recipe(name)
        assert CARD_MIB - int(arg(r, "--vram-idle-mib")) == free_idle
        assert CARD_MIB - int(arg(r, "--vram-loaded-mib")) == free_loaded

    def test_the_incumbents_figures_are_marked_as_ours_and_keep_the_reserve(self) -> None:
        r = recipe("stub-incumbent-524k")
        assert {"args.--vram-idle-mib", "args.--vram-loaded-mib", "max_concurrency"} <= set(r.assumed)
        assert CARD_MIB - int(arg(r, "--vram-loaded-mib")) >= 3072

    def test_pin_the_stub_image_the_build_script_computes(self) -> None:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build_stub_image.py"), "--print-id"],
            capture_output=True,
            text=True,
            check=True,
        )
        image_id = out.stdout.strip()
        assert image_id.startswith("sha256:")
        assert {recipe(n).image for n in STUBS} == {image_id}


class TestSeedRecipes:
    @pytest.mark.parametrize("name", SEEDS)
    def test_validate_but_are_not_runnable(self, name: str) -> None:
        r = recipe(name)
        assert not r.runnable
        assert r.tp_size == 2
        assert r.gpu_roles == ("compute-a", "compute-b")
        assert r.port == 8001

    @pytest.mark.parametrize("name", SEEDS[1:])
    def test_sglang_recipes_carry_the_seeds_pins_flags_and_env(self, name: str) -> None:
        r = recipe(name)
        assert r.model == GLM_MODEL
        assert r.image == SGLANG_IMAGE
        assert r.env == {
            "NCCL_CUMEM_ENABLE": "0",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
        }
        assert arg(r, "--tp-size") == "2"
        assert arg(r, "--chunked-prefill-size") == "4096"
        assert arg(r, "--kv-cache-dtype") == "fp8_e4m3"
        assert arg(r, "--context-length") == str(r.context_tokens)
        assert arg(r, "--max-running-requests") == str(r.max_concurrency)
        assert arg(r, "--mm-process-config") == '{"image":{"max_image_tokens":3072}}'
        assert "args.adaptive-eagle-mtp-steps" in r.unknown
        assert "entrypoint" in r.unknown and r.entrypoint is None

    def test_the_499k_profile_has_no_invented_served_name(self) -> None:
        r = recipe(SEEDS[3])
        assert r.served_model is None
        assert "served_model" in r.unknown
        assert "--served-model-name" not in r.args

    def test_the_incumbent_pins_the_seeds_image_id_and_leaves_the_rest_unknown(self) -> None:
        r = recipe(SEEDS[0])
        assert r.image == "sha256:4909e318ba1348a179824e210f90c268d6fc68e8b4e514af4782e26e6a1e5939"
        assert r.served_model == SEEDS[0]
        assert r.context_tokens == 524288
        assert r.model is None and "model" in r.unknown
        assert r.args == () and "args" in r.unknown
