"""Every journal boundary of every plan, SIGKILLed there, then `recover`: never dark.

Each case forks a child that runs one command on the shipped fakes with `crash_at`
naming one boundary; the child kills itself with SIGKILL right after that journal
row commits. The parent then runs `recover` twice and checks what an operator
needs: the transaction ended at the exact before or after state (committed or
compensated, never waiting for a person), a slot that served at the start serves
and is routed, `recheck` passes where the incumbent serves, the audit chain
verifies, the dead owner's lock row is released, and the next command succeeds.

The boundaries are not listed by hand: a clean run of each scenario journals them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import audit, lifecycle, recheck, transactions
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.availability import observe_slot
from anvil_ctl.engine.lock import held_locks
from scripts.campaign import verified_decision
from tests.unit.fakehost import FakeHost, make_fake_host


def _load(host: FakeHost, **kw: Any) -> Any:
    return transactions.load(host.app(), slot="primary", candidate=host.candidate(**kw))


def _verified(host: FakeHost) -> None:
    app = host.app()
    verified_decision(app.store, "primary", "d-fi")


def _promote(host: FakeHost) -> Any:
    return lifecycle.promote(host.app(), slot="primary", approved_by="operator")


def _rollback(host: FakeHost) -> Any:
    return lifecycle.rollback(host.app(), slot="primary")


def _loaded(host: FakeHost) -> None:
    assert _load(host).state == TxState.COMMITTED
    _verified(host)


def _promoted(host: FakeHost) -> None:
    _loaded(host)
    assert _promote(host).state == TxState.COMMITTED


def _fail_once(op: str) -> Callable[[FakeHost], None]:
    def arm(host: FakeHost) -> None:
        host.world.set_fail(op, "injected", times=1)

    return arm


@dataclass(frozen=True)
class Scenario:
    kind: str
    setup: Callable[[FakeHost], None]
    command: Callable[[FakeHost], Any]
    arm: Callable[[FakeHost], None] | None = None
    """Arms a one-shot failure after setup, so that the run compensates (undo boundaries)."""


SCENARIOS = {
    "load": Scenario("load", lambda h: None, _load),
    "load-compensates": Scenario("load", lambda h: None, lambda h: _load(h, fail_health=True)),
    "promote": Scenario("promote", _loaded, _promote),
    "promote-compensates": Scenario("promote", _loaded, _promote, _fail_once("acceptance")),
    "rollback": Scenario("rollback", _promoted, _rollback),
    "rollback-compensates": Scenario("rollback", _promoted, _rollback, _fail_once("readmit")),
}


def _fresh(root: Path, scenario: Scenario) -> FakeHost:
    root.mkdir(parents=True, exist_ok=True)
    host = make_fake_host(root)
    scenario.setup(host)
    if scenario.arm is not None:
        scenario.arm(host)
    return host


def _boundaries(root: Path, scenario: Scenario) -> list[str]:
    """Every journal boundary a clean run of the scenario passes, in order."""
    host = _fresh(root, scenario)
    out = scenario.command(host)
    shown = audit.show(host.app(), out.tx_id or "")
    rows = [f"{scenario.kind}:state:{s['state']}" for s in shown["states"]]
    rows += [f"{scenario.kind}:{e['step']}:{e['phase']}:{e['event']}" for e in shown["steps"]]
    return list(dict.fromkeys(rows))


def _cases() -> list[tuple[str, str]]:
    import tempfile

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, scenario in SCENARIOS.items():
            for boundary in _boundaries(Path(tmp) / name, scenario):
                cases.append((name, boundary))
    return cases


CASES = _cases()


def _run_killed(host: FakeHost, scenario: Scenario, boundary: str) -> None:
    """Run the command in a forked child that SIGKILLs itself at `boundary`."""
    pid = os.fork()
    if pid == 0:  # the child: the same command, with the crash armed
        code = 3
        try:
            settings = host.settings.model_copy(update={"crash_at": boundary})
            app = App(settings=settings, env={})
            child = FakeHost(host.root, settings, host.world, host.image_id, host.incumbent_id)
            child.context = lambda: app  # type: ignore[method-assign]
            scenario.command(child)
            code = 4  # the boundary was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"child did not die at {boundary}: status {status}"
    )


@pytest.mark.parametrize(("scenario", "boundary"), CASES, ids=[f"{s}@{b}" for s, b in CASES])
def test_a_kill_at_every_boundary_recovers_to_before_or_after_and_never_dark(
    tmp_path: Path, scenario: str, boundary: str
) -> None:
    sc = SCENARIOS[scenario]
    host = _fresh(tmp_path, sc)
    serving_before = observe_slot(host.app().world(), "primary").serving
    _run_killed(host, sc, boundary)
    with host.world.edit() as w:  # a failure armed for the run must not hit what follows
        w["fail"], w["fail_times"] = {}, {}

    first = transactions.recover_all(host.app())
    second = transactions.recover_all(host.app())
    assert first.exit_code == 0, first.as_dict()
    assert second.exit_code == 0 and second.recovered == [], second.as_dict()

    app = host.app()
    tx = audit.transactions(app, kind=sc.kind, limit=1)[0]
    assert tx["state"] in ("committed", "compensated", "refused"), tx
    assert audit.verify(app)["ok"]
    assert held_locks(app.store) == []  # the dead owner's row went with its transaction
    state = observe_slot(app.world(), "primary")
    if sc.kind == "load" and tx["state"] == "committed":
        # The after state of a load: the candidate answers directly, the tier drained by design.
        assert state.models == ("cand-393k",) and state.routed_model is None, state
    elif sc.kind == "promote" and tx["state"] != "committed":
        # The before state of a promote: the loaded candidate answers, not yet routed.
        assert state.models == ("cand-393k",) and state.routed_model is None, state
    else:
        assert serving_before or sc.kind == "promote"
        assert state.serving, (tx, state)  # never dark
    committed = tx["state"] == "committed"
    # Where the recorded incumbent is what serves (a load's after state and a promote's
    # before state serve the candidate directly, which recheck rightly calls drift).
    incumbent_serves = sc.kind == "rollback" or (sc.kind == "load") != committed
    if incumbent_serves:
        result = recheck.recheck(app, "primary")
        assert result.passed, [a for a in result.assertions if not a["passed"]]
    # The next command on this host succeeds.
    if sc.kind == "load" and tx["state"] == "committed":
        assert _rollback(host).state == TxState.COMMITTED
    elif sc.kind == "load":
        assert _load(host, name="again").state == TxState.COMMITTED
    elif sc.kind == "promote" and tx["state"] == "committed":
        assert _rollback(host).state == TxState.COMMITTED
    elif sc.kind == "promote":
        assert _promote(host).state == TxState.COMMITTED
    elif tx["state"] == "committed":  # rolled back to the old incumbent: promote the candidate again
        assert _rollback(host).state == TxState.REFUSED  # nothing left to restore: it serves
    else:
        assert _rollback(host).state == TxState.COMMITTED


def test_every_plan_has_boundaries_to_kill_at() -> None:
    kinds = {SCENARIOS[s].kind for s, _ in CASES}
    assert kinds == {"load", "promote", "rollback"}
    undo = [b for _, b in CASES if ":undo:" in b]
    assert {b.split(":")[0] for b in undo} == {"load", "promote", "rollback"}
