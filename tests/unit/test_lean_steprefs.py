"""Step rows name their transaction by an integer (issue 13, bytes per transaction): migration 0016.

- A step row written from 0016 on leaves `tx_id` NULL and names its transaction by `tx_ref`,
  the key of the transaction's first (`planned`) state row; the Store, `audit show` and
  `v_steps` read the steps as written, and `v_steps` shows the transaction's ID.
- The README's step query (`v_steps ... where tx_id glob 'PREFIX*'`) searches indexes for
  both forms, never a scan of a history table.
- A step moved to another transaction (its `tx_ref` edited past the trigger) is named.
- A database from before 0016 (steps named by `tx_id`, the column NOT NULL) is upgraded by
  copying the table: every row and key kept, the append-only triggers back, the ORM and the
  schema agreeing; its rows and the new ones verify together, in full and from a checkpoint,
  and read back in order; a downgrade keeps every row and an upgrade after it changes none.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from anvil_ctl.commands import audit
from anvil_ctl.commands.dbcopy import db_copy
from anvil_ctl.persistence import txref
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from anvil_ctl.persistence.models import Base
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, named, raw_rows, verify_after_edit
from tests.unit.test_lean_records import _cycle

STEP_QUERY = "select seq, step, phase, event, at from v_steps where tx_id glob ?"
"""README.md's step query, with the transaction's prefix as a parameter."""


def _tx(host: FakeHost, kind: str, n: int = -1) -> str:
    return str(raw_rows(host, "SELECT id FROM transactions WHERE kind = ? ORDER BY created_at", kind)[n][0])


def _the_0015_way(m: pytest.MonkeyPatch) -> None:
    """Write step rows as anvilctl at 0015 did: named by `tx_id`."""
    m.setattr(txref, "first_state", lambda _s, _tx_id: None)


def _store_steps(host: FakeHost, tx_id: str) -> list[tuple[object, ...]]:
    return [(e.seq, e.step, e.phase, e.event, e.at) for e in host.app().store.step_events(tx_id)]


class TestStepRefs:
    def test_new_steps_name_their_transaction_by_its_first_state_and_read_back(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert raw_rows(host, "SELECT count(*) FROM step_events WHERE tx_id IS NOT NULL") == [(0,)]
        tx_id = _tx(host, "rollback")
        ((first,),) = raw_rows(host, "SELECT min(id) FROM transaction_states WHERE tx_id = ?", tx_id)
        ((state,),) = raw_rows(host, "SELECT state FROM transaction_states WHERE id = ?", first)
        assert state == "planned"
        refs = raw_rows(host, "SELECT DISTINCT tx_ref FROM step_events WHERE tx_ref = ?", first)
        assert refs == [(first,)]
        stored = _store_steps(host, tx_id)
        assert len(stored) > 10
        assert raw_rows(host, STEP_QUERY, tx_id[:8] + "*") == stored  # v_steps: the same, in order
        shown = audit.show(host.app(), tx_id)
        assert [(s["seq"], s["step"], s["phase"], s["event"], s["at"]) for s in shown["steps"]] == stored
        assert [s[1] for s in _store_steps(host, _tx(host, "promote"))] != [s[1] for s in stored]
        assert audit.verify(host.app(), full=True)["ok"]

    def test_the_readme_step_query_searches_indexes_for_both_forms(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        plan = [str(r[-1]) for r in raw_rows(host, "EXPLAIN QUERY PLAN " + STEP_QUERY, "8259*")]
        assert any("ix_step_events_tx_id_id" in p for p in plan), plan
        assert any("ix_step_events_tx_ref_id" in p for p in plan), plan
        assert any("ix_transaction_states_tx_id_id" in p for p in plan), plan
        assert not [p for p in plan if p.startswith("SCAN")], plan

    def test_a_step_moved_to_another_transaction_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        ((other,),) = raw_rows(
            host, "SELECT min(id) FROM transaction_states WHERE tx_id = ?", _tx(host, "promote")
        )
        row_id = raw_rows(host, "SELECT max(id) FROM step_events")[0][0]
        report = verify_after_edit(
            host,
            "step_events_no_update",
            "UPDATE step_events SET tx_ref = ? WHERE id = ?",
            (other, row_id),
        )
        assert named(report) == [("step_events", row_id, EDITED)]


def _as_at_0015(host: FakeHost) -> None:
    """Give the database the `step_events` table of 0015 (tx_id NOT NULL, no tx_ref), its
    rows, keys and triggers as they were: what a database from before 0016 holds."""
    engine = make_engine(f"sqlite:///{db_file(host)}")
    command.downgrade(alembic_config(engine), "0015")
    engine.dispose()
    con = sqlite3.connect(db_file(host))
    try:
        triggers = [
            str(sql)
            for (sql,) in con.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'step_events'"
            )
        ]
        assert len(triggers) == 3
        ((view,),) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'v_steps'")
        assert "tx_ref" not in str(view)  # the downgrade's: 0015's
        columns = "id, tx_id, seq, step, phase, event, detail_json, at, host_id"
        con.executescript(
            f"""
            DROP VIEW v_steps;
            CREATE TABLE old_steps (id INTEGER NOT NULL, tx_id VARCHAR(36) NOT NULL,
                seq INTEGER NOT NULL, step VARCHAR(64) NOT NULL, phase VARCHAR(8) NOT NULL,
                event VARCHAR(16) NOT NULL, detail_json TEXT NOT NULL, at VARCHAR(32) NOT NULL,
                host_id SMALLINT REFERENCES hosts (id), PRIMARY KEY (id),
                FOREIGN KEY(tx_id) REFERENCES transactions (id));
            INSERT INTO old_steps ({columns}) SELECT {columns} FROM step_events ORDER BY id;
            DROP TABLE step_events;
            ALTER TABLE old_steps RENAME TO step_events;
            CREATE INDEX ix_step_events_tx_id_id ON step_events (tx_id, id);
            {";".join(triggers)};
            {view};
            """
        )
        con.commit()
    finally:
        con.close()


class TestUpgradeTo0016:
    def test_steps_of_both_forms_verify_and_read_in_order_across_the_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0015_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        assert raw_rows(host, "SELECT count(*) FROM step_events WHERE tx_id IS NULL") == [(0,)]
        assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among 0015 rows
        _as_at_0015(host)
        assert "tx_ref" not in {str(r[1]) for r in raw_rows(host, "PRAGMA table_info(step_events)")}
        before = raw_rows(host, "SELECT id, tx_id, seq, step, phase, event, detail_json, at FROM step_events")
        old_tx = _tx(host, "rollback")
        old_steps = raw_rows(host, STEP_QUERY, old_tx[:8] + "*")

        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.upgrade(alembic_config(engine), "head")  # copies the table
        columns = {str(r[1]): r[3] for r in raw_rows(host, "PRAGMA table_info(step_events)")}
        assert columns["tx_id"] == 0 and "tx_ref" in columns  # tx_id NULL-able
        assert (
            raw_rows(host, "SELECT id, tx_id, seq, step, phase, event, detail_json, at FROM step_events")
            == before
        )
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            edit = sqlite3.connect(db_file(host))
            try:
                edit.execute("UPDATE step_events SET seq = seq + 1 WHERE id = 1")
            finally:
                edit.close()
        assert raw_rows(host, STEP_QUERY, old_tx[:8] + "*") == old_steps == _store_steps(host, old_tx)

        _cycle(host, 2)
        assert {r[0] is None for r in raw_rows(host, "SELECT tx_id FROM step_events")} == {True, False}
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        assert audit.verify(host.app(), full=True)["ok"]
        new_tx = _tx(host, "rollback")
        assert raw_rows(host, STEP_QUERY, new_tx[:8] + "*") == _store_steps(host, new_tx) != []

        stored = "SELECT * FROM step_events ORDER BY id"
        rows = raw_rows(host, stored)
        command.downgrade(alembic_config(engine), "0015")  # every row stays as stored
        assert raw_rows(host, stored) == rows
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert raw_rows(host, stored) == rows
        assert audit.verify(host.app(), full=True)["ok"]
        assert raw_rows(host, STEP_QUERY, new_tx[:8] + "*") == _store_steps(host, new_tx)


class TestCopiedSteps:
    def test_db_copy_names_each_step_by_its_transactions_first_state_in_the_target(
        self, tmp_path: Path
    ) -> None:
        source = make_fake_host(tmp_path / "a", host="gpu-a", machine_id="a" * 32)
        target = make_fake_host(tmp_path / "b", host="gpu-b", machine_id="b" * 32)
        _cycle(source, 1)
        _cycle(target, 2)  # decision IDs of its own (dec-N)
        _cycle(target, 3)  # the target's state rows take the keys the source's rows have
        tx_id = _tx(source, "rollback")
        steps = raw_rows(source, STEP_QUERY, tx_id[:8] + "*")
        first = "SELECT min(id) FROM transaction_states WHERE tx_id = ?"
        out = db_copy(source.app(), to=f"sqlite:///{db_file(target)}")
        assert out["target_verified"]["ok"] and out["rows"]["step_events"] > 0
        ((moved,),) = raw_rows(target, first, tx_id)
        ((was,),) = raw_rows(source, first, tx_id)
        assert moved != was  # renumbered: the copy's steps name the copy's state row
        assert raw_rows(target, "SELECT count(*) FROM step_events WHERE tx_ref = ?", moved)[0][0] == len(
            steps
        )
        assert raw_rows(target, STEP_QUERY, tx_id[:8] + "*") == steps
        # the bodies its rows name came along (keyed by text; identities.digest is bytes, 0017)
        bodies = "SELECT count(*) FROM identities i JOIN identity_bodies b ON b.digest = lower(hex(i.digest))"
        assert raw_rows(target, bodies + " WHERE i.host_id = 2")[0][0] == raw_rows(source, bodies)[0][0] > 0
