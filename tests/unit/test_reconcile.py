"""`reconcile` and `recheck --repair router` on the shipped fakes: the recorded route is
re-applied when it is lost or stale, left alone when it holds, and never applied to a serve
the record does not publish."""

from __future__ import annotations

from typing import Any

import pytest

from anvil_ctl.commands import audit, recheck, transactions
from anvil_ctl.commands.transactions import reconcile
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.states import TxState
from anvil_ctl.persistence import rechecks
from tests.unit.fakehost import INCUMBENT_MODEL, FakeHost

TIER, URL = "primary-local", "http://127.0.0.1:8001"


def tier(host: FakeHost) -> dict[str, Any]:
    tiers: dict[str, Any] = host.world.read()["router"]["tiers"]
    return tiers.get(TIER, {})


def router_restarted(host: FakeHost) -> None:
    """A restarted router remembers no registration."""
    with host.world.edit() as w:
        w["router"]["tiers"] = {}


def routed(host: FakeHost) -> bool:
    t = tier(host)
    return (t.get("url"), t.get("state")) == (URL, "ready")


def reconciles(host: FakeHost) -> list[dict[str, Any]]:
    return audit.transactions(host.app(), kind="reconcile")


class TestReconcileReapplies:
    def test_a_route_lost_by_a_router_restart_is_re_applied_and_smoked(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMMITTED, out.reason
        step = out.results["route-slot"]
        assert step["changed"] is True and step["already_routed"] is False
        assert "points at None" in step["was"]
        assert out.results["routed-smoke"]["model"] == INCUMBENT_MODEL
        assert routed(fake_host)

    def test_a_stale_route_to_another_backend_is_replaced(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["tiers"][TIER]["url"] = "http://127.0.0.1:9999"
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert routed(fake_host)

    def test_a_drained_tier_is_readmitted(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["tiers"][TIER]["state"] = "drain"
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert routed(fake_host)

    def test_a_route_that_holds_is_recorded_and_left_alone(self, fake_host: FakeHost) -> None:
        fake_host.world.set_fail("readmit", "readmission must not run when the route holds")
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert out.results["route-slot"] == {
            "tier": TIER,
            "url": URL,
            "model": INCUMBENT_MODEL,
            "already_routed": True,
            "changed": False,
        }

    def test_it_is_idempotent(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        first = reconcile(fake_host.app(), "primary")
        second = reconcile(fake_host.app(), "primary")
        assert (first.state, second.state) == (TxState.COMMITTED, TxState.COMMITTED)
        assert second.results["route-slot"]["already_routed"] is True

    def test_a_dry_run_runs_the_guards_and_changes_nothing(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        before = fake_host.world.read()
        out = reconcile(fake_host.app(), "primary", dry_run=True)
        assert out.dry_run and out.refusal is None
        assert [p["step"] for p in out.plan] == ["route-slot", "routed-smoke"]
        assert fake_host.world.read() == before
        assert reconciles(fake_host) == []

    def test_a_readmission_that_fails_ends_compensated_with_its_reason(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        fake_host.world.set_fail("readmit", "backend answered 503")
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.COMPENSATED and out.exit_code == 4
        assert "503" in out.reason

    def test_it_is_journaled_as_a_reconcile_transaction(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        out = reconcile(fake_host.app(), "primary")
        assert [(t["tx_id"], t["state"]) for t in reconciles(fake_host)] == [(out.tx_id, "committed")]


class TestReconcileRefuses:
    def test_a_recorded_serve_that_is_not_running_is_refused_and_nothing_changes(
        self, fake_host: FakeHost
    ) -> None:
        router_restarted(fake_host)
        with fake_host.world.edit() as w:
            w["containers"][fake_host.incumbent_id]["status"] = "exited"
        before = fake_host.world.read()
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "RecordedServeRunning"
        assert "exited, not running" in out.reason
        assert "serves nothing" in out.reason  # names what runs instead: nothing
        assert fake_host.world.read() == before

    def test_a_removed_recorded_serve_is_refused(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            del w["containers"][fake_host.incumbent_id]
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.REFUSED and "no longer exists" in out.reason

    def test_after_a_load_the_unpromoted_candidate_is_named_and_never_routed(
        self, fake_host: FakeHost
    ) -> None:
        loaded = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert loaded.state == TxState.COMMITTED, loaded.reason
        cand_id = str(loaded.results["start-candidate"]["container_id"])
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.REFUSED
        assert f"loaded candidate {cand_id[:12]} (cand-393k), which is not promoted" in out.reason
        assert tier(fake_host)["state"] == "drain"

    def test_a_binding_serving_another_model_is_refused(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["containers"][fake_host.incumbent_id]["served_model"] = "someone-elses-model"
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.REFUSED and "someone-elses-model" in out.reason

    def test_an_unresolved_transaction_is_refused(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        tx = app.store.begin(kind="load", slot="primary", args={}, owner=app.owner, tx_id="tx-open")
        app.store.transition(tx, TxState.RUNNING)
        out = reconcile(fake_host.app(), "primary")
        assert out.state == TxState.REFUSED and out.refusal.guard == "NoUnresolvedTransaction"  # type: ignore[union-attr]

    def test_rejected_router_credentials_are_refused(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["admin_token_ok"] = False
        out = reconcile(fake_host.app(), "primary")
        assert out.refusal is not None and out.refusal.guard == "RouterCredentialsAccepted"

    def test_a_host_without_a_router_is_refused(self, fake_host: FakeHost) -> None:
        cfg = fake_host.settings.config
        cfg.write_text(cfg.read_text().replace('kind = "smg"', 'kind = "none"'))
        out = reconcile(fake_host.app(), "primary")
        assert out.refusal is not None and out.refusal.guard == "RouterConfigured"

    def test_an_unknown_slot_is_bad_input(self, fake_host: FakeHost) -> None:
        with pytest.raises(BadInput):
            reconcile(fake_host.app(), "nope")


class TestRecheckRepairsTheRoute:
    def test_without_repair_recheck_only_reports_a_missing_route(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        result = recheck.recheck(fake_host.app(), "primary")
        assert {"router_readiness", "route_holds", "routed_smoke"} <= set(result.failed)
        assert tier(fake_host) == {} and reconciles(fake_host) == []

    def test_a_missing_route_is_reconciled_then_rechecked_and_both_are_recorded(
        self, fake_host: FakeHost
    ) -> None:
        router_restarted(fake_host)
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",))
        assert result.passed, result.failed
        assert result.repair is not None and result.repair["committed"] is True
        assert "route_holds" in result.repair["failed_before"]
        (tx,) = reconciles(fake_host)
        assert (result.repair["tx_id"], tx["state"]) == (tx["tx_id"], "committed")
        after, before = rechecks.rechecks(fake_host.app().store)[:2]
        assert (before["id"], before["passed"]) == (result.repair["before_recheck_id"], False)
        assert (after["id"], after["passed"]) == (result.recheck_id, True)
        assert {"name": "router_repair", "passed": True, "observed": result.repair} in result.assertions

    def test_a_healthy_slot_runs_no_repair(self, fake_host: FakeHost) -> None:
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",))
        assert result.passed and result.repair is None
        assert reconciles(fake_host) == []

    def test_a_failing_serve_is_never_repaired(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        with fake_host.world.edit() as w:
            w["containers"][fake_host.incumbent_id]["served_model"] = "wrong-model"
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",))
        assert "served_model" in result.failed and result.repair is None
        assert reconciles(fake_host) == [] and tier(fake_host) == {}

    def test_other_failures_stay_failed_and_unrepaired(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        with fake_host.world.edit() as w:
            w["residue"].append({"path": "/dev/shm/sglang-offload-0", "size": 4096})
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",))
        assert result.failed == ["shm_residue_zero"]
        assert fake_host.world.read()["residue"]  # never touched
        assert routed(fake_host)

    def test_a_repair_that_is_refused_is_recorded_as_such(self, fake_host: FakeHost) -> None:
        router_restarted(fake_host)
        app = fake_host.app()
        app.store.transition(
            app.store.begin(kind="load", slot="primary", args={}, owner=app.owner, tx_id="tx-open"),
            TxState.RUNNING,
        )
        result = recheck.recheck(app, "primary", repair=("router",))
        assert not result.passed and "router_repair" in result.failed
        assert result.repair is not None and result.repair["state"] == "refused"
        assert tier(fake_host) == {}

    def test_an_unknown_repair_is_bad_input(self, fake_host: FakeHost) -> None:
        with pytest.raises(BadInput, match="gpu"):
            recheck.recheck(fake_host.app(), "primary", repair=("gpu",))
