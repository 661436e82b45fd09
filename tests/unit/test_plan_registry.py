"""The registry of transaction kinds: every kind rebuilds from its journal form, in any process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from anvil_ctl.core.ports import Owner
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.owner import current_owner
from anvil_ctl.engine.plans import KINDS
from anvil_ctl.engine.plans.args import (
    AbArgs,
    AbArm,
    AdoptArgs,
    CanaryArgs,
    LoadArgs,
    PromoteArgs,
    QualifyArgs,
    ReconcileArgs,
    RollbackArgs,
    UnloadArgs,
    from_json,
    to_json,
)
from anvil_ctl.qualify.canary import policy_to_json
from anvil_ctl.qualify.watchpolicy import DEFAULT
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


def _samples(host: FakeHost) -> dict[str, object]:
    app = host.app()
    inc = app.store.current_identity("primary", "incumbent")
    assert inc is not None
    cand = host.candidate()
    return {
        "adopt": AdoptArgs(slot="primary", identity=inc),
        "load": LoadArgs(slot="primary", candidate=cand, incumbent=inc, incumbent_running=True),
        "promote": PromoteArgs(
            slot="primary", candidate=inc, incumbent=inc, decision_id="dec-1", approved_by="ops"
        ),
        "canary": CanaryArgs(
            slot="primary",
            candidate=inc,
            incumbent=inc,
            decision_id="dec-1",
            decision_outcome="verified",
            approved_by="ops",
            shares=(10, 50, 100),
            step_watch_s=2.0,
            watch=policy_to_json(DEFAULT),
            profile="smoke",
            vram_need_mib=(None, 4096),
        ),
        "rollback": RollbackArgs(
            slot="primary",
            target=inc,
            current=None,
            current_role="",
            current_routed=False,
            restore_group="g",
            restore_group_members=("abc",),
            recorded_sha256="0" * 64,
        ),
        "qualify": QualifyArgs(
            slot="primary",
            candidate=inc,
            profile="smoke",
            gates=("tools",),
            recipe="r",
            engine="sglang",
            source={"release": "v1", "external_prior": [{"figure": "fast", "where": "notes"}]},
        ),
        "ab": AbArgs(slot="primary", arms=(AbArm("a", inc), AbArm("b", inc)), profile="ab-stub"),
        "unload": UnloadArgs(container_id="c" * 64, slot="primary", remove_residue=True),
        "reconcile": ReconcileArgs(slot="primary", serve=inc),
    }


class TestRegistry:
    def test_every_kind_is_listed_once_with_its_argument_class(self) -> None:
        assert {k: v.args.__name__ for k, v in KINDS.items()} == {
            "adopt": "AdoptArgs",
            "load": "LoadArgs",
            "promote": "PromoteArgs",
            "canary": "CanaryArgs",
            "rollback": "RollbackArgs",
            "qualify": "QualifyArgs",
            "ab": "AbArgs",
            "unload": "UnloadArgs",
            "reconcile": "ReconcileArgs",
        }

    @pytest.mark.parametrize("kind", sorted(KINDS))
    def test_arguments_survive_the_journal_unchanged(self, kind: str, fake_host: FakeHost) -> None:
        args = _samples(fake_host)[kind]
        journaled = json.loads(json.dumps(to_json(args)))
        assert from_json(KINDS[kind].args, journaled) == args

    @pytest.mark.parametrize("kind", sorted(KINDS))
    def test_a_plan_rebuilt_from_the_journal_has_the_same_steps(self, kind: str, fake_host: FakeHost) -> None:
        world = fake_host.app().world()
        args = _samples(fake_host)[kind]
        live = KINDS[kind].build(args, world)
        rebuilt = KINDS[kind].rebuild(json.loads(json.dumps(to_json(args))), world)
        assert [s.name for s in rebuilt.steps] == [s.name for s in live.steps]
        assert rebuilt.args == args and rebuilt.kind == kind

    def test_a_journal_row_that_does_not_fit_the_class_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="slot"):
            from_json(UnloadArgs, {"container_id": "c"})

    def test_argument_classes_are_frozen(self) -> None:
        for kind in KINDS.values():
            params = kind.args.__dataclass_params__  # type: ignore[attr-defined]
            assert params.frozen, kind.args
            assert fields(kind.args)


CHILD = """
import sys
from anvil_ctl.bootstrap import App
from anvil_ctl.config.settings import Settings
from anvil_ctl.engine.recover import recover_unfinished
from anvil_ctl.log import configure

configure("json", "warning")
root = sys.argv[1]
settings = Settings(state_dir=root + "/state", config=root + "/anvil.toml", backend="fake", _env_file=None)
app = App(settings=settings, env={})
report = recover_unfinished(app.owner, app.world())
loaded = sorted(m for m in sys.modules if m.startswith("anvil_ctl.commands") or m == "anvil_ctl.qualify")
print(report.recovered[0]["state"], loaded)
"""


class TestRecoverRebuildsQualify:
    def test_a_process_that_imported_only_the_engine_recovers_a_qualify_transaction(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        inc = app.store.current_identity("primary", "incumbent")
        assert inc is not None
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        me = current_owner()
        owner = Owner(pid=int(dead.stdout), hostname=me.hostname, boot_id=me.boot_id)
        args = QualifyArgs(slot="primary", candidate=inc, profile="smoke")
        tx = app.store.begin(
            kind="qualify", slot="primary", args=to_json(args), owner=owner, tx_id="tx-qualify"
        )
        app.store.transition(tx, TxState.RUNNING)
        app.store.step_event(tx, seq=0, step="run-gates", phase="do", event="intent")

        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(fake_host.root)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.split()[0] == "compensated"
        assert child.stdout.strip().endswith("[]"), child.stdout  # no command module, no qualify library
        assert app.store.state(tx) == TxState.COMPENSATED
