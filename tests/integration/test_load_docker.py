"""`load` and `unload` on the real Docker Engine, inside the test namespace (simulated GPUs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import serves, transactions
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.persistence.migrate import upgrade
from tests.integration.hosts import INCUMBENT, sim_host_toml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOST = sim_host_toml()


def variant(recipes: Path, name: str, extra_args: list[str], timeout_s: float = 60.0) -> None:
    """A copy of stub-393k-c1 named `name` with extra stub arguments (mounts made absolute)."""
    src = (REPO / "recipes" / "stub-393k-c1.toml").read_text()
    src = src.replace('name = "stub-393k-c1"', f'name = "{name}"')
    src = src.replace('"../anvil_', f'"{REPO}/anvil_')
    src = src.replace("startup_timeout_s = 60.0", f"startup_timeout_s = {timeout_s}")
    quoted = "".join(f' "{a}",' for a in extra_args)
    src = src.replace('  "--vram-loaded-mib", "95786",\n]', f'  "--vram-loaded-mib", "95786",{quoted}\n]')
    (recipes / f"{name}.toml").write_text(src)


@pytest.fixture
def host(tmp_path: Path, stub_container: Any, runtime: Any) -> dict[str, Any]:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    variant(recipes, "good-393k", [])
    variant(recipes, "wrong-name-393k", ["--wrong-served-name", "not-the-recipe-model"], 8)
    variant(recipes, "never-healthy-393k", ["--fail-health"], 4)
    (tmp_path / "anvil.toml").write_text(HOST)
    settings = Settings(  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        config=tmp_path / "anvil.toml",
        recipes_dir=recipes,
        backend="real",
        gpu="simulated",
    )
    app = App(settings=settings, env={})
    upgrade(app.create_database())
    inc = stub_container(
        served_model=INCUMBENT,
        port=8001,
        labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"},
        extra_args=["--max-model-len", "524288"],
    )
    out = transactions.adopt(app, slot="primary", container_id=inc.id, context_tokens=524288)
    assert out.state == TxState.COMMITTED, out.reason
    created: list[str] = []
    yield {"app": app, "incumbent": inc, "runtime": runtime, "created": created}
    for c in runtime.list(labels={"io.anvil.role": "candidate"}):
        runtime.remove(c.id, force=True)


def counts(app: App) -> dict[str, int]:
    with app.store.read() as s:
        return {
            t: s.execute(text(f"select count(*) from {t}")).scalar_one()
            for t in ("transactions", "step_events", "snapshots", "identities")
        }


def containers(runtime: Any) -> dict[str, str]:
    return {c.id: c.status for c in runtime.list()}


class TestLoadOnDocker:
    def test_load_keeps_the_incumbent_id_stopped_and_serves_the_candidate(self, host: dict[str, Any]) -> None:
        app, rt, inc = host["app"], host["runtime"], host["incumbent"]
        out = serves.load(app, "good-393k", slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert rt.inspect(inc.id).status == "exited"
        cand = rt.inspect(out.results["start-candidate"]["container_id"])
        assert cand.running and cand.labels["io.anvil.transaction"] == out.tx_id
        served = out.after.body["slots"]["primary"]["serving"]["models"] if out.after else None
        assert served == [["glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp", 393216]]

    @pytest.mark.parametrize("recipe", ["wrong-name-393k", "never-healthy-393k"])
    def test_a_bad_candidate_compensates_to_the_same_incumbent_container(
        self, host: dict[str, Any], recipe: str
    ) -> None:
        app, rt, inc = host["app"], host["runtime"], host["incumbent"]
        out = serves.load(app, recipe, slot="primary")
        assert out.state == TxState.COMPENSATED and out.exit_code == 4
        assert "await-candidate" in out.reason
        assert rt.inspect(inc.id).running  # the same container ID serves again
        kept = rt.list(labels={"io.anvil.transaction": out.tx_id or ""})
        assert [c.status for c in kept] == ["exited"]  # proven stopped, kept for diagnosis
        models = out.after.body["slots"]["primary"]["serving"]["models"] if out.after else []
        assert [m[0] for m in models] == [INCUMBENT]


class TestRefusalsOnDocker:
    def _assert_unchanged(
        self, host: dict[str, Any], out: Any, before_db: dict[str, int], before_host: dict[str, str]
    ) -> None:
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert containers(host["runtime"]) == before_host
        after = counts(host["app"])
        assert after == {**before_db, "transactions": before_db["transactions"] + 1}

    def test_an_absent_pinned_image_is_refused(self, host: dict[str, Any], tmp_path: Path) -> None:
        recipes = host["app"].settings.recipes_dir
        src, pinned = re.subn(
            r'^image = "sha256:[0-9a-f]{64}"$',
            f'image = "sha256:{"0" * 64}"',
            (recipes / "good-393k.toml").read_text(),
            flags=re.MULTILINE,
        )
        assert pinned == 1
        (recipes / "absent-image.toml").write_text(src.replace('name = "good-393k"', 'name = "absent-image"'))
        before_db, before_host = counts(host["app"]), containers(host["runtime"])
        out = serves.load(host["app"], "absent-image", slot="primary")
        self._assert_unchanged(host, out, before_db, before_host)
        assert out.refusal.guard == "CandidateImagePinned"

    def test_a_removed_incumbent_is_refused(self, host: dict[str, Any]) -> None:
        rt, inc = host["runtime"], host["incumbent"]
        rt.remove(inc.id, force=True)
        before_db, before_host = counts(host["app"]), containers(rt)
        out = serves.load(host["app"], "good-393k", slot="primary")
        self._assert_unchanged(host, out, before_db, before_host)
        assert "was removed" in out.reason

    def test_a_binding_held_by_a_container_we_do_not_own_is_refused(
        self, host: dict[str, Any], stub_container: Any
    ) -> None:
        rt, inc = host["runtime"], host["incumbent"]
        rt.stop(inc.id, 5)
        stub_container(served_model="someone-else", port=8001)
        before_db, before_host = counts(host["app"]), containers(rt)
        out = serves.load(host["app"], "good-393k", slot="primary")
        self._assert_unchanged(host, out, before_db, before_host)
        assert out.refusal.guard == "BindingNotTaken"


class TestUnloadOnDocker:
    def test_unload_refuses_a_container_we_did_not_create(
        self, host: dict[str, Any], stub_container: Any
    ) -> None:
        foreign = stub_container(served_model="foreign")
        out = serves.unload(host["app"], foreign.id, yes=True)
        assert isinstance(out, Outcome) and out.state == TxState.REFUSED
        assert "not created by anvilctl" in out.reason
        assert host["runtime"].inspect(foreign.id).running

    def test_unload_refuses_the_incumbent(self, host: dict[str, Any]) -> None:
        inc = host["incumbent"]
        out = serves.unload(host["app"], inc.id, yes=True)
        assert isinstance(out, Outcome) and out.state == TxState.REFUSED
        assert host["runtime"].inspect(inc.id).running

    def test_unload_removes_a_candidate_it_created(self, host: dict[str, Any]) -> None:
        out = serves.load(host["app"], "wrong-name-393k", slot="primary")
        kept = host["runtime"].list(labels={"io.anvil.transaction": out.tx_id or ""})
        result = serves.unload(host["app"], kept[0].id, yes=True)
        assert isinstance(result, Outcome) and result.state == TxState.COMMITTED, result
        assert result.results["remove-candidate"]["removed"] is True
        assert host["runtime"].list(labels={"io.anvil.transaction": out.tx_id or ""}) == []
