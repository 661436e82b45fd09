"""Safety rules found in review: no mutation beside an unresolved transaction, compensation
restores the before state and no more, nothing to restore is refused, a crashed command keeps
its lock row."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.commands import lifecycle, transactions
from anvil_ctl.core.errors import BadInput, LockHeld
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.lock import HostLock, held_locks
from anvil_ctl.engine.owner import current_owner
from tests.unit.fakehost import FakeHost


def _needs_operator(host: FakeHost) -> str:
    """A loaded candidate, then a transaction that a step ended in needs_operator."""
    transactions.load(host.app(), slot="primary", candidate=host.candidate())
    store = host.app().store
    tx = store.begin(kind="rollback", slot="primary", args={}, owner=current_owner(), tx_id="tx-rollback")
    store.transition(tx, TxState.RUNNING)
    store.transition(tx, TxState.NEEDS_OPERATOR, "a step found the host must not be touched")
    return tx


class TestUnresolvedTransactions:
    def test_a_transaction_waiting_for_a_person_refuses_the_next_mutation(self, fake_host: FakeHost) -> None:
        tx = _needs_operator(fake_host)
        before = fake_host.world.read()
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.REFUSED
        assert out.refusal is not None and out.refusal.guard == "NoUnresolvedTransaction"
        assert tx[:8] in out.reason and "needs_operator" in out.reason
        assert fake_host.world.read() == before

    def test_resolve_records_the_person_and_unblocks(self, fake_host: FakeHost) -> None:
        tx = _needs_operator(fake_host)
        with pytest.raises(BadInput):
            transactions.resolve(fake_host.app(), tx[:8], by="", note="")
        done = transactions.resolve(fake_host.app(), tx[:8], by="operator", note="checked by hand")
        assert done == {"tx_id": tx, "from": "needs_operator", "to": "compensated", "resolved_by": "operator"}
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state == TxState.COMMITTED, out.reason


class TestCompensationRestoresNoMore:
    def test_a_failed_load_does_not_start_an_incumbent_that_was_already_stopped(
        self, fake_host: FakeHost
    ) -> None:
        from anvil_ctl.commands import serves

        first = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        serves.unload(fake_host.app(), first.results["start-candidate"]["container_id"], yes=True)
        assert fake_host.world.read()["containers"][fake_host.incumbent_id]["status"] == "exited"
        tier_before = fake_host.world.read()["router"]["tiers"]["primary-local"]["state"]
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(fail_health=True, name="c2")
        )
        assert out.state == TxState.COMPENSATED
        assert [s["step"] for s in out.plan][:2] == ["release-vram", "start-candidate"]
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "exited"
        assert world["router"]["tiers"]["primary-local"]["state"] == tier_before


class TestNothingToRestore:
    def test_a_rollback_whose_target_already_serves_is_refused(self, fake_host: FakeHost) -> None:
        transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert lifecycle.rollback(fake_host.app(), slot="primary").state == TxState.COMMITTED
        out = lifecycle.rollback(fake_host.app(), slot="primary", to=fake_host.incumbent_id[:12])
        assert out.state == TxState.REFUSED and "already serves" in out.reason


class TestLockRows:
    def test_a_command_that_dies_inside_the_lock_keeps_its_row(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        store = fake_host.app().store
        lock = HostLock(store, tmp_path / "anvil.lock", current_owner(), "load")
        lock.acquire()
        lock.release_after(KeyboardInterrupt())
        assert [h.command for h in held_locks(store)] == ["load"]

    def test_a_live_row_refuses_even_when_the_lock_file_was_replaced(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        store = fake_host.app().store
        first = HostLock(store, tmp_path / "a.lock", current_owner(), "load")
        first.acquire()
        try:
            with pytest.raises(LockHeld, match="another mutator holds this host"):
                HostLock(store, tmp_path / "b.lock", current_owner(), "load").acquire()
        finally:
            first.release()


class TestLockFirstArguments:
    def test_bad_input_read_under_the_lock_releases_it(self, fake_host: FakeHost) -> None:
        transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        with pytest.raises(BadInput, match="not the slot's loaded candidate"):
            lifecycle.promote(fake_host.app(), slot="primary", approved_by="op", candidate="nope")
        assert held_locks(fake_host.app().store) == []


class TestRecoverMatchesStepsByName:
    def test_a_journal_that_no_longer_matches_the_plan_goes_to_a_person(self, fake_host: FakeHost) -> None:
        from anvil_ctl.core.ports import StepEvent
        from anvil_ctl.core.steps import NoMemo, Plan, Step
        from anvil_ctl.engine.recover import pending_undos

        plan = Plan(kind="load", args={}, memo=NoMemo(), steps=[Step("stop-incumbent", lambda c: None)])
        events = [StepEvent(0, "drain-tier", "do", "intent", {}, "t")]
        from anvil_ctl.core.errors import NeedsOperator

        with pytest.raises(NeedsOperator, match="does not match the plan"):
            pending_undos(plan, events)


class TestBindingHeldByAStranger:
    def test_a_listening_binding_without_a_running_serve_of_ours_refuses_the_load(
        self, fake_host: FakeHost
    ) -> None:
        from anvil_ctl.commands import serves

        first = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        serves.unload(fake_host.app(), first.results["start-candidate"]["container_id"], yes=True)
        # A server we did not start answers on the binding (no OpenAI model list, say).
        with fake_host.world.edit() as w:
            w["containers"]["stranger"] = {
                "id": "stranger",
                "name": "stranger",
                "image_id": "x",
                "image_ref": "x",
                "status": "running",
                "labels": {},
                "fingerprint": "",
                "gpu_uuids": [],
                "served_model": "",
                "max_model_len": 0,
                "healthy": True,
                "vram_mib": 0,
                "binding": "127.0.0.1:8001",
            }
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate(name="c3"))
        assert out.state == TxState.REFUSED
        assert out.refusal is not None and out.refusal.guard == "BindingNotTaken"
        assert "something we do not own" in out.reason


class TestAdoptRecordsWhatServes:
    def test_a_context_the_engine_does_not_report_is_refused_naming_both(self, fake_host: FakeHost) -> None:
        from anvil_ctl.core.model import ContainerSpec
        from anvil_ctl.testing.runtime import FakeRuntime

        rt = FakeRuntime(fake_host.world)
        other = rt.create(
            ContainerSpec(
                name="side",
                image=fake_host.image_id,
                env=(
                    ("FAKE_SERVED_MODEL", "side"),
                    ("FAKE_BINDING", "127.0.0.1:8001"),
                    ("FAKE_MAX_MODEL_LEN", "32768"),
                ),
            )
        )
        rt.stop(fake_host.incumbent_id, 1)
        rt.start(other)
        with pytest.raises(BadInput, match="reports max_model_len 32768"):
            transactions.adopt(fake_host.app(), slot="primary", container_id=other, context_tokens=524288)
        out = transactions.adopt(fake_host.app(), slot="primary", container_id=other, context_tokens=32768)
        assert out.state == TxState.COMMITTED, out.reason
