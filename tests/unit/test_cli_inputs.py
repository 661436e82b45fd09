"""The CLI as an operator meets it: bad input exits 2 naming the field and changes nothing;
restorability drift refuses before mutation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from anvil_ctl.commands import transactions
from anvil_ctl.core.states import TxState
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


def anvilctl(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


class TestBadInput:
    def test_validate_of_an_unpinned_image_exits_2_naming_file_and_field(self, tmp_path: Path) -> None:
        recipes = tmp_path / "recipes"
        recipes.mkdir()
        src = (REPO / "recipes" / "stub-245k-c1.toml").read_text()
        image_line = next(line for line in src.splitlines() if line.startswith("image = "))
        src = src.replace(image_line, 'image = "anvil-stub:latest"').replace(
            'name = "stub-245k-c1"', 'name = "unpinned"'
        )
        (recipes / "unpinned.toml").write_text(src)
        # No host config named (the default one is absent here: fine for a recipe check).
        env = {k: v for k, v in os.environ.items() if k != "ANVIL_CONFIG"}
        r = anvilctl("recipes", "validate", "unpinned", "--recipes-dir", "recipes", cwd=tmp_path, env=env)
        assert r.returncode == 2
        assert "unpinned.toml: image:" in r.stderr and "not pinned" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "state").exists()  # nothing was created

    def test_an_unknown_slot_exits_2_and_writes_nothing(self, fake_host: FakeHost) -> None:
        before = fake_host.world.read()
        r = anvilctl("load", "stub-245k-c1", "--slot", "nope", cwd=REPO, env=fake_host.env())
        assert r.returncode == 2 and "slot 'nope'" in r.stderr
        assert fake_host.world.read() == before

    def test_an_integer_is_ascii_digits_alone(self, fake_host: FakeHost) -> None:
        before = fake_host.world.read()
        for value in (" 5", "5 ", "\u0665", "+5", "-5", "5.0", "0"):
            args = ("adopt", fake_host.incumbent_id, "--slot", "primary", "--context-tokens", value)
            r = anvilctl(*args, cwd=REPO, env=fake_host.env())
            assert r.returncode == 2, (value, r.stderr)
            assert "--context-tokens" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert fake_host.world.read() == before
        r = anvilctl("audit", "transactions", "--limit", "\u0665", cwd=REPO, env=fake_host.env())
        assert r.returncode == 2 and "digits 0-9" in r.stderr, r.stderr

    def test_every_seed_recipe_plans_through_the_cli(self, fake_host: FakeHost) -> None:
        for name in (
            "glm53-flash-ormandj-sglang-sm120-tp2-240k-c1-adaptive-mtp",
            "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp",
            "glm53-flash-ormandj-sglang-sm120-tp2-499k-c4-adaptive-mtp",
            "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix",
        ):
            r = anvilctl(
                "--json", "recipes", "plan", name, "--slot", "primary", cwd=REPO, env=fake_host.env()
            )
            assert r.returncode == 0, r.stderr
            assert '"spec"' in r.stdout and '"runnable": false' in r.stdout


class TestRestorability:
    def test_a_drifted_config_fingerprint_refuses_the_load(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["containers"][fake_host.incumbent_id]["fingerprint"] = "0" * 64
        before = fake_host.world.read()
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.REFUSED and "fingerprint drifted" in out.reason
        assert fake_host.world.read() == before

    def test_a_vanished_incumbent_image_refuses_the_load(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["images"].clear()
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.REFUSED
        assert "is gone from the host" in out.reason
