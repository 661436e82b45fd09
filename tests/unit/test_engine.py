"""The transaction engine on the shipped fakes: journaling, compensation, refusals."""

from __future__ import annotations

import json
from dataclasses import replace

from sqlalchemy import text

from anvil_ctl.commands import audit, transactions
from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.states import TxState
from anvil_ctl.core.steps import NoMemo, Plan, Step, StepContext, StepResult
from anvil_ctl.engine.owner import current_owner
from anvil_ctl.engine.runner import TransactionEngine
from tests.unit.fakehost import INCUMBENT_MODEL, FakeHost


def _table_counts(host: FakeHost) -> dict[str, int]:
    app = host.app()
    with app.store.read() as s:
        return {
            t: s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("transactions", "step_events", "snapshots", "identities", "audit_journal")
        }


class TestJournaledSteps:
    def test_every_step_commits_its_intent_before_and_its_result_after(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        out = transactions.load(app, slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        shown = audit.show(app, out.tx_id or "")
        do_events = [(e["step"], e["event"]) for e in shown["steps"] if e["phase"] == "do"]
        names = [s["step"] for s in out.plan]
        assert do_events == [(n, ev) for n in names for ev in ("intent", "result")]
        assert [s["state"] for s in shown["states"]] == ["planned", "running", "committed"]

    def test_load_stops_but_keeps_the_incumbent_and_serves_the_candidate(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        out = transactions.load(app, slot="primary", candidate=fake_host.candidate())
        containers = fake_host.world.read()["containers"]
        assert containers[fake_host.incumbent_id]["status"] == "exited"
        cid = out.results["start-candidate"]["container_id"]
        assert containers[cid]["status"] == "running"
        paths = {c.path for c in out.changes}
        assert any(p.startswith("slots.primary.serving.models") for p in paths), paths


class TestCompensation:
    def test_a_failed_step_undoes_completed_steps_in_reverse_and_journals_each(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        out = transactions.load(app, slot="primary", candidate=fake_host.candidate(fail_health=True))
        assert out.state == TxState.COMPENSATED
        assert out.exit_code == 4
        assert "await-candidate" in out.reason
        events = audit.show(app, out.tx_id or "")["steps"]
        undo_order = [e["step"] for e in events if e["phase"] == "undo" and e["event"] == "result"]
        assert undo_order == ["start-candidate", "stop-incumbent", "drain-tier"]
        # Each undo has its intent journaled before its result.
        for step in undo_order:
            kinds = [e["event"] for e in events if e["phase"] == "undo" and e["step"] == step]
            assert kinds == ["intent", "result"]
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        cand = [c for c in world["containers"].values() if c["name"] == "cand"]
        assert [c["status"] for c in cand] == ["exited"]  # kept for diagnosis, proven stopped
        assert world["router"]["tiers"]["primary-local"]["state"] == "ready"

    def test_the_before_and_compensated_snapshots_differ_only_by_the_kept_candidate(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        out = transactions.load(app, slot="primary", candidate=fake_host.candidate(fail_health=True))
        kept = [c["id"] for c in fake_host.world.read()["containers"].values() if c["name"] == "cand"]
        assert len(kept) == 1
        # One change: the kept candidate's whole record added (never a field-by-field "None ->").
        assert [(c.op, c.path) for c in out.changes] == [("add", f"slots.primary.containers.{kept[0]}")]
        assert out.changes[0].after["status"] == "exited"

    def test_a_failing_undo_stops_compensation_in_compensation_failed(self, fake_host: FakeHost) -> None:
        calls: list[str] = []

        def ok(name: str):  # type: ignore[no-untyped-def]
            def do(ctx: StepContext) -> StepResult:
                calls.append(f"do {name}")
                return {"step": name}

            return do

        def undo_ok(name: str):  # type: ignore[no-untyped-def]
            def undo(ctx: StepContext, r: StepResult) -> StepResult:
                calls.append(f"undo {name}")
                return None

            return undo

        def boom(ctx: StepContext, r: StepResult = None) -> StepResult:
            raise StepFailed("boom")

        plan = Plan(
            kind="test",
            args={},
            memo=NoMemo(),
            steps=[
                Step("a", ok("a"), undo_ok("a")),
                Step("b", ok("b"), boom),
                Step("c", boom, None),
            ],
        )
        app = fake_host.app()
        app.store.begin(kind="test", slot=None, args={}, owner=current_owner(), tx_id="tx-test")
        engine = TransactionEngine(app.store)
        out = engine.run(plan, app.world(), "tx-test")
        engine.commit()
        assert out.state == TxState.COMPENSATION_FAILED
        assert out.exit_code == 5
        assert calls == ["do a", "do b"]  # undo of a never ran after b's undo failed
        assert "undo of b failed" in out.reason


class TestRefusal:
    def test_a_refused_transaction_changes_nothing_but_its_refusal_record(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        world_before = fake_host.world.read()
        counts_before = _table_counts(fake_host)
        cand = fake_host.candidate()
        bad = replace(cand, spec=replace(cand.spec, image="sha256:" + "9" * 64))
        out = transactions.load(app, slot="primary", candidate=bad)
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "CandidateImagePinned"
        assert fake_host.world.read() == world_before
        counts = _table_counts(fake_host)
        assert counts["transactions"] == counts_before["transactions"] + 1
        assert counts["step_events"] == counts_before["step_events"]
        assert counts["snapshots"] == counts_before["snapshots"]
        assert audit.transactions(app, state="refused")[0]["reason"].startswith("pinned image")

    def test_rejected_router_credentials_refuse_before_mutation(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["admin_token_ok"] = False
        before = fake_host.world.read()
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.REFUSED
        assert out.refusal is not None and out.refusal.guard == "RouterCredentialsAccepted"
        assert fake_host.world.read() == before

    def test_a_removed_incumbent_refuses_the_load(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            del w["containers"][fake_host.incumbent_id]
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.REFUSED
        assert "was removed" in out.reason


class TestDryRun:
    def test_dry_run_prints_the_plan_and_writes_nothing(self, fake_host: FakeHost) -> None:
        before_world = fake_host.world.read()
        before_db = _table_counts(fake_host)
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(), dry_run=True
        )
        assert out.dry_run and out.tx_id is None
        assert [s["step"] for s in out.plan] == [
            "drain-tier",
            "stop-incumbent",
            "release-vram",
            "start-candidate",
            "await-candidate",
            "record-candidate",
        ]
        assert out.before is not None
        assert out.before.body["slots"]["primary"]["serving"]["models"] == [[INCUMBENT_MODEL, None]]
        assert fake_host.world.read() == before_world
        assert _table_counts(fake_host) == before_db

    def test_dry_run_reports_a_refusal_without_recording_it(self, fake_host: FakeHost) -> None:
        with fake_host.world.edit() as w:
            w["router"]["admin_token_ok"] = False
        before_db = _table_counts(fake_host)
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(), dry_run=True
        )
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert _table_counts(fake_host) == before_db


class TestAppendOnly:
    def test_history_rows_cannot_be_updated_in_place(self, fake_host: FakeHost) -> None:
        import sqlite3

        import pytest

        db = sqlite3.connect(fake_host.settings.state_dir / "anvil.db")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE transaction_states SET state='committed'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM audit_journal")
        db.close()

    def test_identity_records_are_json_with_no_token(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        ident = app.store.current_identity("primary", "incumbent")
        assert ident is not None and ident.container_id == fake_host.incumbent_id
        assert json.loads(json.dumps(ident.as_dict()))["served_model"] == INCUMBENT_MODEL
