"""GPU ownership and the VRAM-release gate end to end: real Docker, simulated GPUs, stub engines.

The incumbent is a stub holding 92,000 MiB on both simulated cards (adopted: it
owns both roles exclusively). `load stub-393k-c1` stops it, waits for its memory
to be observed free (need 94,536 + reserve 3,072 per card), starts the candidate
and moves both roles to it. A GPU start in a second slot is then refused naming
the candidate, and a managed container nobody recorded in the ledger refuses a
load by its PID and name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import audit, serves, transactions
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.persistence import gpu_ledger
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.recipes.model import load_recipe
from tests.integration.hosts import sim_host_toml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INCUMBENT = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
UA = "GPU-00000000-0000-4000-8000-0000000000a1"
UB = "GPU-00000000-0000-4000-8000-0000000000b2"
HOST = sim_host_toml(
    UA,
    UB,
    extra="""[slots.secondary]
binding = "127.0.0.1:8002"
router_tier = "secondary-local"
aliases = ["llm.secondary"]
gpu_roles = ["compute-a", "compute-b"]""",
)


def copy_recipe(recipes: Path, name: str = "stub-393k-c1", **changes: str) -> None:
    """The shipped recipe with mounts made absolute; `changes` replace whole lines (key = ...)."""
    src = (REPO / "recipes" / "stub-393k-c1.toml").read_text()
    src = src.replace('"../anvil_', f'"{REPO}/anvil_')
    src = src.replace('name = "stub-393k-c1"', f'name = "{name}"')
    for old, new in changes.items():
        assert old in src, old
        src = src.replace(old, new)
    (recipes / f"{name}.toml").write_text(src)


def load(app: App, recipe: str, slot: str) -> Outcome:
    """`anvilctl load` as serves.load does it, with the recipe's vram_need_mib on the candidate
    even where commands/serves.py does not pass it yet."""
    cand = serves.candidate_from_recipe(app, recipe, slot)
    if not cand.vram_need_mib:
        need = load_recipe(app.settings.recipes_dir / f"{recipe}.toml").vram_need_mib
        cand = replace(cand, vram_need_mib=need)
    return transactions.load(app, slot=slot, candidate=cand)


def container_states(runtime: Any) -> dict[str, str]:
    return {c.id: c.status for c in runtime.list()}


def transactions_count(app: App) -> int:
    with app.store.read() as s:
        return int(s.execute(text("select count(*) from transactions")).scalar_one())


@pytest.fixture
def host(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[dict[str, Any]]:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    copy_recipe(recipes)
    copy_recipe(
        recipes,
        "side-c1",
        **{
            "tp_size = 2": "tp_size = 1",
            'gpu_roles = ["compute-a", "compute-b"]': 'gpu_roles = ["compute-b"]',
            "port = 8001": "port = 8002",
            '"--port", "8001"': '"--port", "8002"',
            "vram_need_mib = 94536": "vram_need_mib = 1000",
        },
    )
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
        gpu_uuids=[UA, UB],
        extra_args=["--vram-idle-mib", "92000", "--vram-loaded-mib", "93000", "--max-model-len", "524288"],
        labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"},
    )
    out = transactions.adopt(app, slot="primary", container_id=inc.id, context_tokens=524288)
    assert out.state == TxState.COMMITTED, out.reason
    yield {"app": app, "incumbent": inc, "runtime": runtime}
    for c in runtime.list(labels={"io.anvil.role": "candidate"}):
        runtime.remove(c.id, force=True)


class TestGpuOwnershipOnDocker:
    def test_adopt_gives_the_incumbent_both_roles_exclusively(self, host: dict[str, Any]) -> None:
        owners = gpu_ledger.gpu_owners(host["app"].store)
        assert {r: (o["container_id"], o["mode"]) for r, o in owners.items()} == {
            "compute-a": (host["incumbent"].id, "exclusive"),
            "compute-b": (host["incumbent"].id, "exclusive"),
        }

    def test_load_of_stub_393k_claims_both_roles_and_records_the_release_readings(
        self, host: dict[str, Any]
    ) -> None:
        app, rt, inc = host["app"], host["runtime"], host["incumbent"]
        out = load(app, "stub-393k-c1", "primary")
        assert out.state == TxState.COMMITTED, out.reason
        cand = out.results["start-candidate"]["container_id"]
        owners = gpu_ledger.gpu_owners(app.store)
        assert {r: (o["container_id"], o["mode"], o["tx_id"]) for r, o in owners.items()} == {
            "compute-a": (cand, "exclusive", out.tx_id),
            "compute-b": (cand, "exclusive", out.tx_id),
        }
        assert out.after is not None and out.before is not None
        assert out.before.body["gpu_owners"]["compute-a"]["container_id"] == inc.id
        assert out.after.body["gpu_owners"]["compute-b"]["container_id"] == cand
        assert rt.inspect(inc.id).status == "exited"

        gate = out.results["release-vram"]
        assert gate["released"] is True
        assert gate["need_mib"] == 94_536
        assert gate["reserve_mib"] == {"compute-a": 3072, "compute-b": 3072}
        assert gate["required_free_mib"] == {UA: 97_608, UB: 97_608}
        for uuid_ in (UA, UB):
            # The incumbent is proven stopped before the gate's first reading.
            assert gate["before"][uuid_]["total_mib"] == 97_887
            assert gate["after"][uuid_]["free_mib"] >= 97_608
        steps = audit.show(app, out.tx_id or "")["steps"]
        journaled = [e for e in steps if e["step"] == "release-vram" and e["event"] == "result"]
        assert len(journaled) == 1
        assert "before" in str(journaled[0]) and "after" in str(journaled[0])

    def test_a_second_gpu_start_while_the_candidate_owns_the_roles_is_refused_naming_it(
        self, host: dict[str, Any]
    ) -> None:
        app, rt = host["app"], host["runtime"]
        first = load(app, "stub-393k-c1", "primary")
        assert first.state == TxState.COMMITTED, first.reason
        cand = first.results["start-candidate"]["container_id"]
        before_host, before_tx = container_states(rt), transactions_count(app)
        out = load(app, "side-c1", "secondary")
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "GpuRolesFree"
        assert f"owned exclusively by container {cand[:12]} in slot primary" in out.reason
        assert f"transaction {first.tx_id}" in out.reason
        assert container_states(rt) == before_host
        assert transactions_count(app) == before_tx + 1  # only the refusal record

    def test_a_managed_container_outside_the_ledger_refuses_the_load_by_pid(
        self, host: dict[str, Any], stub_container: Any
    ) -> None:
        app, rt, inc = host["app"], host["runtime"], host["incumbent"]
        stray = stub_container(
            served_model="stray",
            gpu_uuids=[UB],
            extra_args=["--vram-idle-mib", "2000"],
        )
        assert stray.pid
        before_host = container_states(rt)
        out = load(app, "stub-393k-c1", "primary")
        assert out.state == TxState.REFUSED, out.reason
        assert out.refusal is not None and out.refusal.guard == "GpuRolesFree"
        assert out.reason == (
            "GPU role compute-b has processes that no known serve owns: "
            f"pid {stray.pid} (2000 MiB; container {stray.id[:12]} ({stray.name}), "
            "not in the GPU ownership ledger)"
        )
        assert container_states(rt) == before_host
        assert rt.inspect(inc.id).running
