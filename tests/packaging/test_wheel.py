"""The wheel works on its own: built from this checkout, installed (not editable) into a fresh
venv, and run from an empty directory that is not the repository, it finds its migrations
and its shipped recipes, and drives a fake-backend load and rollback.

The fresh venv gets the wheel only; its dependencies come from the running venv's
site-packages through a `.pth` line, so the test runs offline. A `.pth` line adds a
directory to sys.path without processing the `.pth` files inside it, so the running
venv's editable install of anvil_ctl is not seen: the test asserts where anvil_ctl was
imported from.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

HOST_TOML = """
host = "wheelhost"
recipes_dir = "host-recipes"

[gpu_roles.compute-a]
uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
capacity_mib = 97887

[gpu_roles.compute-b]
uuid = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
capacity_mib = 97887

[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]
gpu_roles = ["compute-a", "compute-b"]

[router]
kind = "smg"

[policy]
health_poll_s = 0.01
stop_timeout_s = 1
"""

IMAGE = "sha256:" + "1" * 64


def fake_recipe(name: str, served: str) -> str:
    """A recipe the fake backend serves: its FAKE_* environment tells the fake engine what to be."""
    return f"""
name = "{name}"
engine = "stub"
image = "{IMAGE}"
served_model = "{served}"
context_tokens = 131072
max_concurrency = 1
tp_size = 2
gpu_roles = ["compute-a", "compute-b"]
port = 8001
startup_timeout_s = 5.0
profile = "smoke"

[env]
FAKE_SERVED_MODEL = "{served}"
FAKE_BINDING = "127.0.0.1:8001"
FAKE_VRAM_MIB = "90000"
"""


SEED_WORLD = f"""
import sys
from pathlib import Path
from anvil_ctl.core.model import ContainerSpec
from anvil_ctl.testing.router import FakeRouter
from anvil_ctl.testing.runtime import FakeRuntime
from anvil_ctl.testing.world import FakeWorld
world = FakeWorld(Path(sys.argv[1]))
with world.edit() as w:
    for uuid in ("GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"):
        w["gpus"].append({{"uuid": uuid, "name": "Fake GPU", "total_mib": 97887}})
    w["images"]["{IMAGE}"] = {{"id": "{IMAGE}", "tags": ["fake:1"], "repo_digests": []}}
runtime = FakeRuntime(world)
incumbent = runtime.create(
    ContainerSpec(
        name="incumbent",
        image="{IMAGE}",
        env=(("FAKE_SERVED_MODEL", "model-incumbent"), ("FAKE_BINDING", "127.0.0.1:8001")),
    )
)
runtime.start(incumbent)
FakeRouter(world).register("primary-local", "http://127.0.0.1:8001", ("llm.primary",))
print(incumbent)
"""


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the wheel built from this checkout, installed without --editable."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(dist),
            ".",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("anvil_ctl-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    fresh_site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(fresh_site) / "zz_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No ANVIL_* or PYTHONPATH from the caller; HOME and XDG dirs inside tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_") and k != "PYTHONPATH"}
    env |= {
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
    }
    return env | extra


def anvilctl(venv: Path, cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "anvilctl"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


class TestTheInstalledWheel:
    def test_anvil_ctl_is_imported_from_the_fresh_venv_not_the_checkout(
        self, fresh_venv: Path, empty_dir: Path, tmp_path: Path
    ) -> None:
        r = subprocess.run(
            [str(fresh_venv / "bin" / "python"), "-c", "import anvil_ctl; print(anvil_ctl.__file__)"],
            cwd=empty_dir,
            env=clean_env(tmp_path),
            capture_output=True,
            text=True,
            check=True,
        )
        assert Path(r.stdout.strip()).is_relative_to(fresh_venv), r.stdout

    def test_version_init_recipes_and_status_from_an_empty_directory(
        self, fresh_venv: Path, empty_dir: Path, tmp_path: Path
    ) -> None:
        # The state directory is named (as root the default is /var/lib/anvil, which a test
        # must not touch; tests/unit/test_places.py holds the defaults).
        state = tmp_path / "state"
        env = clean_env(tmp_path, ANVIL_STATE_DIR=str(state))
        version = anvilctl(fresh_venv, empty_dir, env, "--version")
        assert version.returncode == 0 and version.stdout.startswith("anvilctl 0."), version

        init = anvilctl(fresh_venv, empty_dir, env, "init")
        assert init.returncode == 0, init.stderr
        assert (state / "anvil.db").is_file()
        assert str(state / "anvil.db") in init.stdout
        assert list(empty_dir.iterdir()) == []

        listed = anvilctl(fresh_venv, empty_dir, env, "recipes", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        names = {r["name"] for r in json.loads(listed.stdout) if r["source"] == "shipped"}
        assert {"stub-393k-c1", "stub-245k-c1", "llama-smollm2-2k"} <= names

        plan = anvilctl(fresh_venv, empty_dir, env, "recipes", "show", "stub-393k-c1", "--json")
        assert plan.returncode == 0, plan.stderr

        # The shipped stub recipes mount `../anvil_stub`, beside the installed package.
        where = subprocess.run(
            [
                str(fresh_venv / "bin" / "python"),
                "-c",
                "import anvil_ctl, anvil_stub; print(anvil_ctl.__file__); print(anvil_stub.__file__)",
            ],
            cwd=empty_dir,
            env=env,
            capture_output=True,
            text=True,
        )
        assert where.returncode == 0, where.stderr
        ctl, stub = (Path(line).parent for line in where.stdout.split())
        assert stub == ctl.parent / "anvil_stub" and (stub / "__main__.py").is_file()
        assert REPO not in stub.parents

    def test_a_fake_backend_load_and_rollback_succeed(
        self, fresh_venv: Path, empty_dir: Path, tmp_path: Path
    ) -> None:
        etc = tmp_path / "etc"
        (etc / "host-recipes").mkdir(parents=True)
        (etc / "anvil.toml").write_text(HOST_TOML)
        (etc / "host-recipes" / "fake-a.toml").write_text(fake_recipe("fake-a", "model-a"))
        state = tmp_path / "state"
        env = clean_env(
            tmp_path, ANVIL_BACKEND="fake", ANVIL_CONFIG=str(etc / "anvil.toml"), ANVIL_STATE_DIR=str(state)
        )
        seed = subprocess.run(
            [str(fresh_venv / "bin" / "python"), "-c", SEED_WORLD, str(state / "fake-world.json")],
            cwd=empty_dir,
            env=env,
            capture_output=True,
            text=True,
        )
        assert seed.returncode == 0, seed.stderr

        def ok(*args: str) -> Any:
            r = anvilctl(fresh_venv, empty_dir, env, *args, "--json")
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            return json.loads(r.stdout)

        ok("init")
        ok("adopt", seed.stdout.strip(), "--slot", "primary", "--context-tokens", "524288")
        sources = {r["name"]: r["source"] for r in ok("recipes", "list")}
        assert sources["fake-a"] == "host config" and sources["stub-393k-c1"] == "shipped"
        assert ok("recipes", "plan", "fake-a", "--slot", "primary")
        assert ok("load", "fake-a", "--slot", "primary")["state"] == "committed"
        assert "model-a" in json.dumps(ok("status"))
        assert ok("rollback", "--slot", "primary")["state"] == "committed"
        status = json.dumps(ok("status"))
        assert "model-incumbent" in status and "model-a" not in status, status
        assert list(empty_dir.iterdir()) == []
