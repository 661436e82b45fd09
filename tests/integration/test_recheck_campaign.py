"""recheck during a qualification, on real Docker with a real smg: the cron line exits 0 with
`phase: qualifying` while the campaign is intact, 6 when it drifts, and judges the serving
phase again once the campaign ends.

The host: slot `primary` on 127.0.0.1:8001 (simulated GPUs), its incumbent a stub container
adopted and routed through smg, a candidate loaded from a copy of `stub-393k-c1`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.adapters.smg import SmgRouter
from anvil_ctl.bootstrap import App
from anvil_ctl.commands import lifecycle, serves, transactions
from anvil_ctl.commands.transactions import reconcile
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.model import Readmission
from anvil_ctl.core.states import TxState
from anvil_ctl.persistence.migrate import upgrade
from scripts.routers import Proc, start_smg
from tests.integration.hosts import INCUMBENT, sim_host_toml
from tests.integration.test_load_docker import variant
from tests.integration.test_router_smg import Keys, creds

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIER, CANDIDATE = "primary-local", "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp"
TOKENS = {"ANVIL_ROUTER_ADMIN_TOKEN": Keys.admin, "ANVIL_ROUTER_CLIENT_TOKEN": Keys.client}


def anvilctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI in a child process, as cron runs it."""
    return subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args], env=env, capture_output=True, text=True, timeout=120
    )


def cli_env(settings: Settings, recipes: Path) -> dict[str, str]:
    """The environment a cron line or a router's start hook runs `anvilctl` with."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANVIL_") or k == "ANVIL_TESTENV"},
        **TOKENS,
        "ANVIL_STATE_DIR": str(settings.state_dir),
        "ANVIL_CONFIG": str(settings.config),
        "ANVIL_RECIPES_DIR": str(recipes),
        "ANVIL_GPU": "simulated",
        "ANVIL_LOG_FORMAT": "json",
    }


def loaded_host(
    tmp_path: Path,
    stub_container: Any,
    router_url: str,
    *,
    load: bool = True,
    incumbent_args: tuple[str, ...] = (),
    candidate_args: tuple[str, ...] = (),
    metrics_url: str | None = None,
) -> dict[str, Any]:
    """A committed load behind the smg at `router_url`: the incumbent (adopted, routed) stopped
    and retained, the tier drained, the candidate serving on 127.0.0.1:8001 (`load=False`: the
    incumbent serving, routed). `*_args`: more stub arguments of each. No VRAM reserve: the
    stub recipe's workload leaves 2,101 MiB per card, which promote's reserve would refuse.
    `metrics_url`: smg's Prometheus page, for its per-worker failure counts."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    variant(recipes, "good-393k", list(candidate_args))
    router = f'kind = "smg"\nurl = "{router_url}"\nreadmit_deadline_s = 60'
    if metrics_url:
        router += f'\nmetrics_url = "{metrics_url}"'
    toml = sim_host_toml().replace('kind = "none"', router)
    toml = toml.replace("[policy]\n", "[policy]\nvram_reserve_mib = 0\n")
    (tmp_path / "anvil.toml").write_text(toml)
    settings = Settings(  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        config=tmp_path / "anvil.toml",
        recipes_dir=recipes,
        backend="real",
        gpu="simulated",
    )
    app = App(settings=settings, env=TOKENS)
    upgrade(app.create_database())
    inc = stub_container(
        served_model=INCUMBENT,
        port=8001,
        labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"},
        extra_args=["--max-model-len", "524288", *incumbent_args],
    )
    assert transactions.adopt(app, slot="primary", container_id=inc.id, context_tokens=524288).state == (
        TxState.COMMITTED
    )
    assert reconcile(app, "primary").state == TxState.COMMITTED  # the incumbent routed
    env = cli_env(settings, recipes)
    serving = anvilctl(env, "--json", "recheck", "--slot", "primary")
    assert serving.returncode == 0 and json.loads(serving.stdout)["phase"] == "serving", serving.stdout
    host = {"app": app, "env": env, "incumbent": inc, "candidate": None}
    if load:
        out = serves.load(app, "good-393k", slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        host["candidate"] = out.results["start-candidate"]["container_id"]
    return host


def close_host(host: dict[str, Any], runtime: Any) -> None:
    host["app"].world().close()
    host["app"].database.dispose()
    for c in runtime.list(labels={"io.anvil.role": "candidate"}):
        runtime.remove(c.id, force=True)


@pytest.fixture
def campaign(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[dict[str, Any]]:
    smg: Proc = start_smg(
        workdir=tmp_path / "smg", admin_token=Keys.admin, client_token=Keys.client, user_token=Keys.user
    )
    host = loaded_host(tmp_path, stub_container, smg.url)
    router = SmgRouter(smg.url, creds())
    yield {**host, "router": router, "runtime": runtime, "textfile": tmp_path / "anvil.prom"}
    router.close()
    close_host(host, runtime)
    smg.stop()


def _recheck(c: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = anvilctl(c["env"], "--json", "recheck", "--slot", "primary", "--textfile", str(c["textfile"]))
    return r.returncode, json.loads(r.stdout)


class TestRecheckDuringQualification:
    def test_the_cron_line_exits_0_with_phase_qualifying(self, campaign: dict[str, Any]) -> None:
        code, out = _recheck(campaign)
        assert (code, out["phase"], out["failed"]) == (0, "qualifying", []), out["assertions"]
        by_name = {a["name"]: a for a in out["assertions"]}
        assert by_name["campaign"]["observed"]["candidate"] == campaign["candidate"]
        assert by_name["incumbent_retained"]["observed"]["status"] == "exited"
        assert by_name["tier_as_loaded"]["observed"]["backends"] == []
        assert by_name["served_model"]["observed"] == [CANDIDATE]
        text = campaign["textfile"].read_text()
        assert 'anvil_recheck_phase{phase="qualifying",slot="primary"} 1.0' in text
        assert 'anvil_recheck_passed{slot="primary"} 1.0' in text

    def test_a_stopped_candidate_exits_6(self, campaign: dict[str, Any]) -> None:
        campaign["runtime"].stop(campaign["candidate"], 5)
        code, out = _recheck(campaign)
        assert (code, out["phase"]) == (6, "qualifying")
        assert {"candidate_container_running", "served_model", "health"} <= set(out["failed"])
        assert "incumbent_retained" not in out["failed"]  # what still holds is not blamed
        assert 'anvil_recheck_passed{slot="primary"} 0.0' in campaign["textfile"].read_text()

    def test_a_tier_routed_by_hand_during_qualification_exits_6(self, campaign: dict[str, Any]) -> None:
        router: SmgRouter = campaign["router"]
        router.readmit(Readmission(TIER, "http://127.0.0.1:8001", ("llm.primary",), CANDIDATE, 60))
        code, out = _recheck(campaign)
        assert (code, out["failed"]) == (6, ["tier_as_loaded"])
        tier = next(a for a in out["assertions"] if a["name"] == "tier_as_loaded")["observed"]
        assert [b[0] for b in tier["backends"]] == ["http://127.0.0.1:8001"] and tier["recorded"] == [], tier

    def test_a_rollback_ends_the_campaign_and_the_serving_phase_passes(
        self, campaign: dict[str, Any]
    ) -> None:
        out = lifecycle.rollback(campaign["app"], slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        code, result = _recheck(campaign)
        assert (code, result["phase"], result["failed"]) == (0, "serving", []), result["assertions"]
        assert 'anvil_recheck_phase{phase="serving",slot="primary"} 1.0' in campaign["textfile"].read_text()
