"""promote, rollback/restore and recheck on the shipped fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import audit, lifecycle, recheck, serves, transactions
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.states import TxState
from anvil_ctl.engine import entry
from anvil_ctl.engine.plans import load as load_plan
from anvil_ctl.engine.plans.args import PromoteRequest
from anvil_ctl.persistence import rechecks, waiver_rows
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.testing.runtime import FakeSharedMemory
from tests.unit.fakehost import INCUMBENT_MODEL, FakeHost


def _load(host: FakeHost, served: str = "cand-393k", **kw: Any) -> str:
    out = transactions.load(host.app(), slot="primary", candidate=host.candidate(served, **kw))
    assert out.state == TxState.COMMITTED, out.reason
    return str(out.results["start-candidate"]["container_id"])


def _promote(host: FakeHost, **kw: Any) -> Any:
    return lifecycle.promote(host.app(), slot="primary", approved_by=kw.pop("approved_by", "operator"), **kw)


@pytest.fixture
def fake_host(fake_host_on: FakeHost) -> FakeHost:
    """Every lifecycle test runs on both state backends (SQLite, and the test environment's
    PostgreSQL server)."""
    return fake_host_on


class TestPromote:
    def test_a_verified_candidate_is_promoted_and_the_old_incumbent_becomes_the_rollback(
        self, fake_host: FakeHost
    ) -> None:
        cand_id = _load(fake_host)
        fake_host.decide("verified")
        out = _promote(fake_host)
        assert out.state == TxState.COMMITTED, out.reason
        app = fake_host.app()
        assert app.store.current_identity("primary", "incumbent").container_id == cand_id  # type: ignore[union-attr]
        assert app.store.current_identity("primary", "rollback").container_id == fake_host.incumbent_id  # type: ignore[union-attr]
        tier = fake_host.world.read()["router"]["tiers"]["primary-local"]
        assert tier["state"] == "ready"
        assert out.results["routed-smoke"]["model"] == "cand-393k"
        assert out.results["acceptance"]["passed"] is True
        assert out.results["record-promotion"]["approved_by"] == "operator"
        assert fake_host.world.read()["containers"][fake_host.incumbent_id]["status"] == "exited"

    @pytest.mark.parametrize("outcome", [None, "policy-infeasible", "failed"])
    def test_without_a_verified_decision_promotion_is_refused_and_nothing_changes(
        self, fake_host: FakeHost, outcome: str | None
    ) -> None:
        _load(fake_host)
        if outcome:
            fake_host.decide(outcome)
        before = fake_host.world.read()
        out = _promote(fake_host)
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "CandidateVerified"
        assert fake_host.world.read() == before

    def test_a_reclassification_counts_only_while_its_waiver_is_active(self, fake_host: FakeHost) -> None:
        from datetime import UTC, datetime

        from anvil_ctl.core.waiver import Waiver

        _load(fake_host)
        fake_host.decide("policy-infeasible")
        app = fake_host.app()
        w = Waiver(
            id="w-1",
            policy="vram-reserve",
            value=0,
            approved_by="op",
            reason="model-only pair",
            created_at=datetime.now(UTC),
            roles=frozenset({"compute-a", "compute-b"}),
        )
        waiver_rows.add_waiver(app.store, w)
        fake_host.decide("verified", waiver_ids=("w-1",), decision_id="d-2", reclassifies="d-1")
        waiver_rows.revoke_waiver(app.store, "w-1", by="op", reason="changed mind")
        out = _promote(fake_host)
        assert out.state == TxState.REFUSED
        assert "policy-infeasible" in out.reason

    def test_an_empty_approver_is_bad_input_and_writes_nothing(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        fake_host.decide("verified")
        before = audit.transactions(fake_host.app(), limit=1000)
        with pytest.raises(BadInput, match="--approved-by: expected a non-empty value"):
            _promote(fake_host, approved_by=" ")
        assert audit.transactions(fake_host.app(), limit=1000) == before

    def test_the_plan_itself_refuses_an_empty_approver(self, fake_host: FakeHost) -> None:
        """The ApproverNamed guard still holds for a caller that builds the request itself."""
        _load(fake_host)
        fake_host.decide("verified")
        app = fake_host.app()
        out = entry.run(app.world(), app.owner, PromoteRequest(slot="primary", approved_by=" "))
        assert out.state == TxState.REFUSED and out.refusal.guard == "ApproverNamed"  # type: ignore[union-attr]

    def test_a_failed_acceptance_compensates_to_the_before_state(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        fake_host.decide("verified")
        app = fake_host.app()
        incumbent_before = app.store.current_identity("primary", "incumbent")
        fake_host.world.set_fail("readmit", "backend answered 503")
        out = _promote(fake_host)
        assert out.state == TxState.COMPENSATED and out.exit_code == 4
        assert app.store.current_identity("primary", "incumbent") == incumbent_before
        assert fake_host.world.read()["router"]["tiers"]["primary-local"]["state"] == "drain"


class TestVramAfterAcceptance:
    """Promote reads each card after the real clients ran, against the reserve in force."""

    def test_the_reading_is_in_the_journal_the_promotion_record_audit_show_and_a_verified_bundle(
        self, fake_host: FakeHost
    ) -> None:
        from anvil_ctl.commands import audit as audit_cmd
        from anvil_ctl.evidence.bundle import verify_bundle

        _load(fake_host)
        fake_host.decide("verified")
        out = _promote(fake_host)
        assert out.state == TxState.COMMITTED, out.reason
        reading = out.results["vram-after-acceptance"]
        assert reading["when"] == "after real-client acceptance" and reading["passed"] is True
        assert [(c["role"], c["free_mib"], c["threshold_mib"]) for c in reading["cards"]] == [
            ("compute-a", 3887, 3072),
            ("compute-b", 3887, 3072),
        ]
        # the promotion record names the reading (its step, outcome and manifest), not a copy
        assert out.results["record-promotion"]["vram_after_acceptance"] == {
            "step": "vram-after-acceptance",
            "passed": True,
            "manifest_sha256": reading["manifest_sha256"],
        }
        shown = audit_cmd.show(fake_host.app(), out.tx_id or "")
        assert any(
            e["step"] == "vram-after-acceptance" and e["detail"].get("cards") == reading["cards"]
            for e in shown["steps"]
        )
        bundle = fake_host.settings.evidence_dir / (out.tx_id or "")
        assert verify_bundle(bundle).ok and (bundle / reading["artifact"]).is_file()
        # Bound to the database (`evidence verify` and the report accept only bound bundles).
        from anvil_ctl.commands import evidence as evidence_cmd

        assert evidence_cmd.verify_evidence(fake_host.app(), bundle).ok

    def test_a_card_below_the_reserve_undoes_the_promotion_naming_it(self, fake_host: FakeHost) -> None:
        _load(fake_host, vram_mib=95786)
        fake_host.decide("verified")
        app = fake_host.app()
        incumbent_before = app.store.current_identity("primary", "incumbent")
        out = _promote(fake_host)
        assert out.state == TxState.COMPENSATED and out.exit_code == 4
        assert "compute-a 2101 < 3072 MiB" in out.reason
        assert app.store.current_identity("primary", "incumbent") == incumbent_before
        assert fake_host.world.read()["router"]["tiers"]["primary-local"]["state"] == "drain"

    def test_an_active_reserve_waiver_applies_as_for_qualification(self, fake_host: FakeHost) -> None:
        from datetime import UTC, datetime

        from anvil_ctl.core.waiver import Waiver

        _load(fake_host, vram_mib=95786)
        fake_host.decide("verified")
        waiver = Waiver(
            id="w-pair",
            policy="vram-reserve",
            value=0,
            approved_by="op",
            reason="model-only pair",
            created_at=datetime.now(UTC),
            roles=frozenset({"compute-a", "compute-b"}),
        )
        waiver_rows.add_waiver(fake_host.app().store, waiver)
        out = _promote(fake_host)
        assert out.state == TxState.COMMITTED, out.reason
        reading = out.results["vram-after-acceptance"]
        assert reading["waivers"] == ["w-pair"] and reading["standing_mib"] == {
            "compute-a": 3072,
            "compute-b": 3072,
        }
        assert [(c["free_mib"], c["threshold_mib"]) for c in reading["cards"]] == [(2101, 0), (2101, 0)]


class TestRollback:
    def test_restore_after_a_load_brings_back_the_same_container_and_equal_placement(
        self, fake_host: FakeHost
    ) -> None:
        cand_id = _load(fake_host)
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        assert world["containers"][cand_id]["status"] == "exited"  # retained, not removed
        diffs = audit.diff(fake_host.app(), out.tx_id or "")
        assert [d["equal"] for d in diffs if d["label"] == "recorded-restored"] == [True]

    def test_rollback_after_a_promotion_returns_to_the_exact_old_incumbent(self, fake_host: FakeHost) -> None:
        cand_id = _load(fake_host)
        fake_host.decide("verified")
        assert _promote(fake_host).state == TxState.COMMITTED
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        app = fake_host.app()
        assert app.store.current_identity("primary", "incumbent").container_id == fake_host.incumbent_id  # type: ignore[union-attr]
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        assert world["containers"][cand_id]["status"] == "exited"
        assert recheck.recheck(app, "primary").passed

    def test_a_restore_group_without_the_rollback_identity_is_refused(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        cfg = fake_host.settings.config
        cfg.write_text(cfg.read_text() + '\n[restore_groups]\nsplit-a = ["0123456789abcdef"]\n')
        before = fake_host.world.read()
        out = lifecycle.rollback(fake_host.app(), slot="primary", restore_group="split-a")
        assert out.state == TxState.REFUSED
        assert "does not contain the declared rollback identity" in out.reason
        assert fake_host.world.read() == before

    def test_an_unknown_restore_group_is_bad_input(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        with pytest.raises(BadInput, match="restore_groups"):
            lifecycle.rollback(fake_host.app(), slot="primary", restore_group="nope")

    def test_a_removed_retained_container_refuses_the_rollback(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        with fake_host.world.edit() as w:
            del w["containers"][fake_host.incumbent_id]
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.REFUSED and "was removed" in out.reason

    def test_rejected_credentials_refuse_before_mutation(self, fake_host: FakeHost) -> None:
        _load(fake_host)
        with fake_host.world.edit() as w:
            w["router"]["admin_token_ok"] = False
        before = fake_host.world.read()
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.REFUSED and out.refusal.guard == "RouterCredentialsAccepted"  # type: ignore[union-attr]
        assert fake_host.world.read() == before

    def test_a_failure_after_the_target_started_compensates_to_exactly_the_before_state(
        self, fake_host: FakeHost
    ) -> None:
        cand = _load(fake_host)
        fake_host.world.set_fail("readmit", "HTTP 401 from the router")
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.COMPENSATED and out.exit_code == 4, out.reason
        assert out.reason.startswith("route-back:")
        containers = fake_host.world.read()["containers"]
        # The target was stopped again and kept; the candidate serves at the binding as before.
        assert containers[fake_host.incumbent_id]["status"] == "exited"
        assert containers[cand]["status"] == "running"
        steps = audit.show(fake_host.app(), out.tx_id or "")["steps"]
        undone = [e["step"] for e in steps if e["phase"] == "undo" and e["event"] == "result"]
        assert undone == ["start-target", "stop-current", "drain-tier"]


class TestRecheck:
    @pytest.fixture
    def restored(self, fake_host: FakeHost) -> FakeHost:
        return fake_host

    def test_a_healthy_slot_passes_every_assertion(self, restored: FakeHost) -> None:
        result = recheck.recheck(restored.app(), "primary")
        assert result.passed and result.exit_code == 0
        names = {a["name"] for a in result.assertions}
        assert {
            "incumbent_container_running",
            "served_model",
            "routed_smoke",
            "router_readiness",
            "no_candidate_running",
            "shm_residue_zero",
            "loopback_binding",
            "health",
        } <= names
        assert rechecks.rechecks(restored.app().store)[0]["passed"] is True

    def test_each_injected_drift_is_named(self, restored: FakeHost) -> None:
        app = restored.app()

        def failed() -> list[str]:
            r = recheck.recheck(app, "primary")
            assert r.exit_code == (0 if r.passed else 6)
            return r.failed

        with restored.world.edit() as w:
            w["residue"].append({"path": "/dev/shm/sglang-offload-0", "size": 4096})
        assert failed() == ["shm_residue_zero"]
        with restored.world.edit() as w:
            w["residue"].clear()
            w["router"]["tiers"]["primary-local"]["url"] = "http://127.0.0.1:9999"
        assert "router_readiness" in failed()
        with restored.world.edit() as w:
            w["router"]["tiers"]["primary-local"]["url"] = "http://127.0.0.1:8001"
            w["containers"][restored.incumbent_id]["served_model"] = "wrong-model"
        assert {"served_model", "routed_smoke"} <= set(failed())
        with restored.world.edit() as w:
            w["containers"][restored.incumbent_id]["served_model"] = INCUMBENT_MODEL
            w["containers"][restored.incumbent_id]["status"] = "exited"
        assert "incumbent_container_running" in failed()

    def test_a_candidate_left_running_is_drift(self, restored: FakeHost) -> None:
        rt = restored.app().world().runtime
        spec = restored.candidate("stray").spec
        cid = rt.create(type(spec)(**{**spec.__dict__, "env": (("FAKE_BINDING", "127.0.0.1:9002"),)}))
        rt.start(cid)
        assert recheck.recheck(restored.app(), "primary").failed == ["no_candidate_running"]

    def test_textfile_metrics_are_written_atomically(self, restored: FakeHost, tmp_path: Any) -> None:
        result = recheck.recheck(restored.app(), "primary")
        path = tmp_path / "textfile" / "anvil.prom"
        path.parent.mkdir()  # the directory is the operator's: never created by a recheck
        recheck.write_textfile(path, result, now=1.0)
        text = path.read_text()
        assert 'anvil_recheck_passed{slot="primary"} 1' in text
        assert 'anvil_recheck_up{slot="primary"} 1' in text
        assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


class TestRouterRestartedMidCommand:
    def _restart_router_at_first_routed_chat(self, host: FakeHost, app: Any, monkeypatch: Any) -> list[str]:
        """The fake router loses every registration right before the first routed chat that
        would have reached a registered backend (a router restarted after the route step)."""
        world = app.world()
        original = world.router.routed_chat
        lost: list[str] = []

        def chat(alias: str) -> Any:
            tier = host.world.read()["router"]["tiers"].get("primary-local") or {}
            if not lost and tier.get("state") == "ready":
                with host.world.edit() as w:
                    w["router"]["tiers"] = {}
                lost.append(alias)
            return original(alias)

        monkeypatch.setattr(world.router, "routed_chat", chat)
        return lost

    def test_promote_puts_the_route_back_and_commits(self, fake_host: FakeHost, monkeypatch: Any) -> None:
        _load(fake_host)
        fake_host.decide("verified")
        app = fake_host.app()
        lost = self._restart_router_at_first_routed_chat(fake_host, app, monkeypatch)
        out = lifecycle.promote(app, slot="primary", approved_by="operator")
        assert lost == ["llm.primary"]  # the restart happened mid-command
        assert out.state == TxState.COMMITTED, out.reason
        assert "route_reapplied" in out.results["routed-smoke"]
        assert fake_host.world.read()["router"]["tiers"]["primary-local"]["state"] == "ready"

    def test_rollback_puts_the_route_back_and_commits(self, fake_host: FakeHost, monkeypatch: Any) -> None:
        _load(fake_host)
        fake_host.decide("verified")
        assert _promote(fake_host).state == TxState.COMMITTED
        app = fake_host.app()
        lost = self._restart_router_at_first_routed_chat(fake_host, app, monkeypatch)
        out = lifecycle.rollback(app, slot="primary")
        assert lost and out.state == TxState.COMMITTED, out.reason
        routed = app.world().router.routed_chat("llm.primary")
        assert routed.status == 200 and routed.model != "cand-393k"


class TestLoadThenPromote:
    """`load --promote`: the promotion runs in the load's process, as its own transaction."""

    @pytest.fixture(autouse=True)
    def _stub_image(self, fake_host: FakeHost) -> None:
        """The image the shipped stub recipe pins, present on the fake host."""
        image = load_recipe(Path(__file__).parents[2] / "recipes" / "stub-245k-c1.toml").image
        with fake_host.world.edit() as w:
            w["images"][image] = {"id": image, "tags": [], "repo_digests": []}

    def test_a_candidate_qualified_before_is_promoted_by_the_load_that_starts_it(
        self, fake_host: FakeHost
    ) -> None:
        assert serves.load(fake_host.app(), "stub-245k-c1", slot="primary").state == TxState.COMMITTED
        fake_host.decide("verified")  # its qualification digest outlives the container
        assert lifecycle.rollback(fake_host.app(), slot="primary").state == TxState.COMMITTED
        out = serves.load(fake_host.app(), "stub-245k-c1", slot="primary", promote_approved_by="alice")
        assert (out.state, out.then and out.then.state) == (TxState.COMMITTED, TxState.COMMITTED)
        assert out.exit_code == 0 and out.as_dict()["then"]["kind"] == "promote"  # type: ignore[index]
        started = out.results["start-candidate"]["container_id"]
        incumbent = fake_host.app().store.current_identity("primary", "incumbent")
        assert incumbent is not None and incumbent.container_id == started
        assert fake_host.world.read()["router"]["tiers"]["primary-local"]["state"] == "ready"

    def test_the_promotion_starts_from_the_load_s_closing_reading_of_the_host(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert serves.load(fake_host.app(), "stub-245k-c1", slot="primary").state == TxState.COMMITTED
        fake_host.decide("verified")
        assert lifecycle.rollback(fake_host.app(), slot="primary").state == TxState.COMMITTED
        scans: list[int] = []
        real = FakeSharedMemory.residue
        monkeypatch.setattr(FakeSharedMemory, "residue", lambda shm: scans.append(1) or real(shm))
        out = serves.load(fake_host.app(), "stub-245k-c1", slot="primary", promote_approved_by="alice")
        assert out.then is not None and out.then.state == TxState.COMMITTED, out.then and out.then.reason
        # The load's first reading and its after snapshot's; the promotion's after snapshot's.
        # Its guards and before snapshot asked nothing again: it starts from what the load saw.
        assert len(scans) == 3
        assert out.after is not None and out.then.before is not None
        assert out.then.before.sha256 == out.after.sha256

    def test_the_candidate_s_identity_is_read_while_it_gets_ready_not_after(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Read while the engine starts: `record-candidate`, with no serve routed, only writes."""
        calls: list[str] = []
        read, wait = load_plan.candidate_identity, load_plan.wait_serving
        monkeypatch.setattr(load_plan, "candidate_identity", lambda *a: calls.append("identity") or read(*a))
        monkeypatch.setattr(load_plan, "wait_serving", lambda *a: calls.append("ready") or wait(*a))
        out = serves.load(fake_host.app(), "stub-245k-c1", slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        assert calls == ["identity", "ready"]
        recorded = fake_host.app().store.current_identity("primary", "candidate")
        started = out.results["start-candidate"]["container_id"]
        assert recorded is not None and recorded.container_id == started
        assert recorded.image_id == fake_host.app().world().runtime.inspect(started).image_id

    def test_an_unqualified_candidate_stays_loaded_and_the_command_exits_refused(
        self, fake_host: FakeHost
    ) -> None:
        out = serves.load(fake_host.app(), "stub-245k-c1", slot="primary", promote_approved_by="alice")
        assert out.state == TxState.COMMITTED and out.then is not None
        assert out.then.state == TxState.REFUSED and "no decision recorded" in out.then.reason
        assert out.exit_code == 3
        candidate = fake_host.app().store.current_identity("primary", "candidate")
        assert (
            candidate is not None and candidate.container_id == out.results["start-candidate"]["container_id"]
        )
        assert fake_host.world.read()["router"]["tiers"]["primary-local"]["state"] == "drain"

    def test_an_empty_approver_is_bad_input_and_nothing_runs(self, fake_host: FakeHost) -> None:
        before = fake_host.world.read()
        with pytest.raises(BadInput, match="--approved-by"):
            serves.load(fake_host.app(), "stub-245k-c1", slot="primary", promote_approved_by=" ")
        assert fake_host.world.read() == before


class TestAcceptanceWorkerForksBeforeTheWorld:
    """The real client's worker is forked before the world is built, so the child holds none of
    its connections: also with `--timeout`, whose limit is set on the world."""

    @pytest.mark.parametrize("command", ["promote", "canary"])
    @pytest.mark.parametrize("timeout_s", [None, 30.0])
    def test_the_fork_comes_first(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, command: str, timeout_s: float | None
    ) -> None:
        from anvil_ctl.bootstrap import App

        order: list[str] = []
        world = App.world
        monkeypatch.setattr(App, "warm_acceptance", lambda self: order.append("fork"))
        monkeypatch.setattr(App, "world", lambda self: order.append("world") or world(self))
        monkeypatch.setattr(lifecycle, "enter", lambda app, request, dry_run=False: order.append("enter"))
        app = fake_host.app()
        if command == "promote":
            lifecycle.promote(app, slot="primary", approved_by="operator", timeout_s=timeout_s)
        else:
            lifecycle.canary(
                app,
                slot="primary",
                approved_by="operator",
                shares="10,100",
                step_watch_s=1.0,
                timeout_s=timeout_s,
            )
        assert order[0] == "fork" and order[-1] == "enter"
        assert ("world" in order) == (timeout_s is not None or command == "canary")
