"""An authentication failure is no verdict on a serve: nothing is undone because of one.

`recover` refuses before it writes anything when the router refuses our credentials or they
cannot be resolved (exit 3, the transaction left for a run with the key); a step or a goal
check the router refuses ends `needs_operator` without an undo; and never-dark's
`ensure_serving` does not bring a harbour back over a route it could not observe, nor does
`recheck --repair router` reconcile one.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from sqlalchemy import text

from anvil_ctl.bootstrap import App, UnresolvedCredentialsRouter
from anvil_ctl.commands import audit, lifecycle, recheck, transactions
from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.core.steps import NoMemo, Plan, Step, StepContext, StepResult
from anvil_ctl.engine import entry
from anvil_ctl.engine.availability import ensure_serving
from anvil_ctl.engine.owner import current_owner
from anvil_ctl.engine.runner import TransactionEngine
from scripts.campaign import verified_decision
from tests.unit.fakehost import FakeHost

MISSING = CredentialError(
    "router client token not found; tried env ANVIL_ROUTER_CLIENT_TOKEN",
    kind="client",
    tried="env ANVIL_ROUTER_CLIENT_TOKEN",
)


def _without_key(host: FakeHost) -> Any:
    """The host's world as `anvilctl` builds it when the client token cannot be resolved."""
    world = host.app().world()
    world.router = UnresolvedCredentialsRouter(MISSING)
    return world


def _promote_killed_at(host: FakeHost, boundary: str) -> str:
    """A promote in a forked child that SIGKILLs itself right after `boundary` commits; its ID."""
    out = transactions.load(host.app(), slot="primary", candidate=host.candidate())
    assert out.state == TxState.COMMITTED, out.reason
    verified_decision(host.app().store, "primary", "d-auth")
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            settings = host.settings.model_copy(update={"crash_at": boundary})
            lifecycle.promote(App(settings=settings, env={}), slot="primary", approved_by="operator")
            code = 4  # the boundary was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    (rec,) = host.app().store.unfinished()
    return rec.id


def _rows(host: FakeHost) -> dict[str, int]:
    with host.app().store.read() as s:
        return {
            t: s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("transactions", "step_events", "locks", "audit_journal")
        }


class TestRecoverWithoutTheRoutersKey:
    @pytest.mark.parametrize(
        ("boundary", "direction"),
        [
            ("promote:route-to-candidate:do:intent", "backward"),  # before the pivot's result
            ("promote:acceptance:do:intent", "forward"),  # past it
        ],
    )
    def test_it_refuses_naming_the_credential_changes_nothing_and_a_run_with_the_key_converges(
        self, fake_host: FakeHost, boundary: str, direction: str
    ) -> None:
        tx = _promote_killed_at(fake_host, boundary)
        store = fake_host.app().store
        state, rows, world = store.state(tx), _rows(fake_host), fake_host.world.read()

        with pytest.raises(AuthRejected) as refused:
            entry.recover(_without_key(fake_host), fake_host.app().owner)
        assert refused.value.exit_code == ExitCode.REFUSED
        assert "recover changed nothing" in str(refused.value)
        assert "ANVIL_ROUTER_CLIENT_TOKEN" in str(refused.value)
        assert refused.value.data["waiting"] == [tx]
        assert (store.state(tx), _rows(fake_host)) == (state, rows)  # not a row written
        assert fake_host.world.read()["containers"] == world["containers"]
        assert fake_host.world.read()["router"]["tiers"] == world["router"]["tiers"]

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)
        (done,) = report.recovered
        assert (done["tx_id"], done["direction"], report.exit_code) == (tx, direction, 0), done
        assert store.state(tx) == (TxState.COMPENSATED if direction == "backward" else TxState.COMMITTED)

    def test_with_nothing_to_recover_it_needs_no_key(self, fake_host: FakeHost) -> None:
        report = entry.recover(_without_key(fake_host), fake_host.app().owner)
        assert (report.recovered, report.exit_code) == ([], 0)

    def test_a_router_that_does_not_answer_the_probe_is_no_credential_problem(
        self, fake_host: FakeHost
    ) -> None:
        tx = _promote_killed_at(fake_host, "promote:acceptance:do:intent")
        fake_host.world.set_fail("probe_credentials", "connection refused", times=1)
        report = entry.recover(fake_host.app().world(), fake_host.app().owner)
        assert [r["tx_id"] for r in report.recovered] == [tx]
        assert fake_host.app().store.state(tx) == TxState.COMMITTED


def _engine_run(host: FakeHost, plan: Plan[Any, Any, Any]) -> Any:
    app = host.app()
    app.store.begin(kind="test", slot=None, args={}, owner=current_owner(), tx_id="tx-auth")
    engine = TransactionEngine(app.store)
    out = engine.run(plan, app.world(), "tx-auth")
    engine.commit()
    return out


class TestAnAuthFailureMidRunUndoesNothing:
    def _plan(self, calls: list[str], *, step_refused: bool, goal_refused: bool) -> Plan[Any, Any, Any]:
        def do(name: str):  # type: ignore[no-untyped-def]
            def run(ctx: StepContext) -> StepResult:  # type: ignore[type-arg]
                if name == "b" and step_refused:
                    raise AuthRejected("router answered 401 to the client token from env X")
                calls.append(f"do {name}")
                return {}

            return run

        def undo(ctx: StepContext, r: StepResult) -> StepResult:  # type: ignore[type-arg]
            calls.append("undo a")
            return None

        def goal(ctx: StepContext) -> list[str]:  # type: ignore[type-arg]
            if goal_refused:
                raise AuthRejected("router answered 401 to the client token from env X")
            return []

        steps = [Step("a", do("a"), undo), Step("b", do("b"), undo)]
        return Plan(kind="test", args={}, memo=NoMemo(), steps=steps, goal=goal)

    def test_a_step_the_router_refuses_ends_needs_operator_with_no_undo(self, fake_host: FakeHost) -> None:
        calls: list[str] = []
        out = _engine_run(fake_host, self._plan(calls, step_refused=True, goal_refused=False))
        assert (out.state, out.exit_code) == (TxState.NEEDS_OPERATOR, ExitCode.NEEDS_OPERATOR)
        assert calls == ["do a"]
        assert "b: the router refused our credentials" in out.reason and "nothing was undone" in out.reason

    def test_a_goal_check_the_router_refuses_ends_needs_operator_with_no_undo(
        self, fake_host: FakeHost
    ) -> None:
        calls: list[str] = []
        out = _engine_run(fake_host, self._plan(calls, step_refused=False, goal_refused=True))
        assert out.state == TxState.NEEDS_OPERATOR, out.reason
        assert calls == ["do a", "do b"]
        assert out.reason.startswith("the goal check: the router refused our credentials")


class TestNeverDarkDoesNotActBlind:
    def test_a_route_it_cannot_observe_brings_no_harbour_back(self, fake_host: FakeHost) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        app = fake_host.app()
        harbour = app.store.current_identity("primary", "incumbent")
        assert harbour is not None
        app.store.record_identity(out.tx_id or "", "harbour", harbour)
        before = fake_host.world.read()
        result = ensure_serving(_without_key(fake_host), out.tx_id or "", "primary")
        assert result["action"] == "none" and "ANVIL_ROUTER_CLIENT_TOKEN" in str(result["unobserved"])
        after = fake_host.world.read()
        assert (after["containers"], after["router"]) == (before["containers"], before["router"])


class TestRecheckRepairsNoRouteItCouldNotObserve:
    def test_a_route_checked_without_the_key_fails_and_runs_no_reconcile(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        app.world().router = UnresolvedCredentialsRouter(MISSING)
        result = recheck.recheck(app, "primary", repair=("router",))
        assert {"router_readiness", "route_holds", "routed_smoke"} <= set(result.failed), result.assertions
        assert result.repair is None
        kinds = [t["kind"] for t in audit.transactions(fake_host.app())]
        assert "reconcile" not in kinds, kinds
