"""Who asks a readmission to hold (`Readmission.hold`), on the shipped fakes.

A live transaction's readmission follows its own drain, which waited until the
removal landed: it does not ask, and ends at its first verified routed chat. Whoever
cannot rule out a removal it never saw asks: `recover` (a dead owner may have sent
one), `reconcile` and the availability restore (whatever broke the route may have
left one pending). The fake router logs every readmission with the flag it got.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import lifecycle, transactions
from anvil_ctl.commands.transactions import reconcile
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.availability import ensure_serving
from scripts.campaign import verified_decision
from tests.unit.fakehost import FakeHost


def readmits(host: FakeHost) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = host.world.read()["router"].get("readmits", [])
    return log


def forget_readmits(host: FakeHost) -> None:
    with host.world.edit() as w:
        w["router"]["readmits"] = []


def loaded_and_verified(host: FakeHost) -> None:
    out = transactions.load(host.app(), slot="primary", candidate=host.candidate())
    assert out.state == TxState.COMMITTED, out.reason
    app = host.app()
    verified_decision(app.store, "primary", "d-hold")


def promoted(host: FakeHost) -> None:
    loaded_and_verified(host)
    out = lifecycle.promote(host.app(), slot="primary", approved_by="operator")
    assert out.state == TxState.COMMITTED, out.reason


def killed_rollback_at(host: FakeHost, boundary: str) -> None:
    """A rollback in a forked child that SIGKILLs itself right after `boundary` commits."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            settings = host.settings.model_copy(update={"crash_at": boundary})
            lifecycle.rollback(App(settings=settings, env={}), slot="primary")
            code = 4  # the boundary was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


class TestLiveTransactionsDoNotAskToHold:
    def test_a_live_promote_readmits_without_asking(self, fake_host: FakeHost) -> None:
        loaded_and_verified(fake_host)
        forget_readmits(fake_host)
        out = lifecycle.promote(fake_host.app(), slot="primary", approved_by="operator")
        assert out.state == TxState.COMMITTED, out.reason
        assert [r["hold"] for r in readmits(fake_host)] == [False]

    def test_a_live_rollback_readmits_without_asking(self, fake_host: FakeHost) -> None:
        promoted(fake_host)
        forget_readmits(fake_host)
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert [r["hold"] for r in readmits(fake_host)] == [False]

    def test_a_live_load_that_compensates_readmits_the_incumbent_without_asking(
        self, fake_host: FakeHost
    ) -> None:
        forget_readmits(fake_host)
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(fail_health=True)
        )
        assert out.state == TxState.COMPENSATED, out.reason
        assert [r["hold"] for r in readmits(fake_host)] == [False]  # the drain's undo


class TestRepairsAskToHold:
    def test_reconcile_asks(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["tiers"] = {}  # a restarted router remembers no registration
        forget_readmits(fake_host)
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert [r["hold"] for r in readmits(fake_host)] == [True]

    def test_the_availability_restore_asks(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["tiers"] = {}
        forget_readmits(fake_host)
        result = ensure_serving(fake_host.app().world(), "tx-restore", "primary")
        assert result["action"] == "rerouted", result
        assert [r["hold"] for r in readmits(fake_host)] == [True]

    def test_recover_asks_for_every_readmission_it_makes(self, fake_host: FakeHost) -> None:
        promoted(fake_host)
        killed_rollback_at(fake_host, "rollback:stop-current:do:result")  # drained, stopped
        forget_readmits(fake_host)
        report = transactions.recover_all(fake_host.app())
        assert report.exit_code == 0, report.as_dict()
        assert [r["state"] for r in report.recovered] == ["compensated"]
        log = readmits(fake_host)
        assert log and all(r["hold"] for r in log), log  # the drain's undo, readmitted by recover
