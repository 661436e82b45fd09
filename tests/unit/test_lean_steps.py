"""Lean step events (issue 13 point 3, bytes per transaction).

- Migration 0012: a step's detail of 128 bytes or more is stored packed on SQLite
  (`coltypes.PackedDetail`, a BLOB tagged `00 7a`) when that is smaller, and read back as
  the text its row digest covers; small details stay text. Steps written before (text)
  and after verify together, in full and from a checkpoint across a downgrade to 0011
  and an upgrade, and a packed detail edited past the trigger is named by table and key.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from alembic import command

from anvil_ctl.commands import audit
from anvil_ctl.persistence import coltypes
from anvil_ctl.persistence.coltypes import PACKED, pack, unpack
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import edit_past_trigger
from tests.unit.test_lean_records import _cycle


def _db(host: FakeHost) -> Path:
    return host.settings.state_dir / "anvil.db"


def _raw(host: FakeHost, sql: str, *args: object) -> list[tuple[object, ...]]:
    con = sqlite3.connect(_db(host))
    try:
        return [tuple(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def _detail_forms(host: FakeHost) -> set[object]:
    return {t for (t,) in _raw(host, "SELECT DISTINCT typeof(detail_json) FROM step_events")}


def _the_0011_way(m: pytest.MonkeyPatch) -> None:
    """Write step details as anvilctl at 0011 did: text."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(coltypes.PackedDetail, "process_bind_param", as_text)


class TestPackedStepDetail:
    def test_large_details_are_packed_and_read_back_as_the_same_steps(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        packed = _raw(
            host,
            "SELECT id, tx_id, step, phase, event, detail_json FROM step_events"
            " WHERE typeof(detail_json) = 'blob'",
        )
        steps = {str(step) for _i, _t, step, _p, _e, _d in packed}
        assert {"release-vram", "vram-after-acceptance"} <= steps, steps
        for *_row, raw in packed:
            assert isinstance(raw, bytes) and raw.startswith(PACKED)
            assert len(raw) < len(unpack(raw).encode())
        assert _raw(host, "SELECT count(*) FROM step_events WHERE typeof(detail_json) = 'text'")[0][0] > 0
        # the Store reads them as the detail written: the rows' decoded text, parsed
        _id, tx_id, step, phase, name, raw = packed[-1]
        assert isinstance(raw, bytes)
        events = host.context().store.step_events(str(tx_id))
        (event,) = [e for e in events if (e.step, e.phase, e.event) == (step, phase, name)]
        assert event.detail == json.loads(unpack(raw))
        shown = audit.show(host.context(), str(tx_id))
        assert any(s["detail"] == event.detail for s in shown["steps"])
        assert audit.verify(host.context(), full=True)["ok"]

    def test_a_packed_detail_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.context(), full=True)["ok"]
        row_id, raw = _raw(
            host, "SELECT id, detail_json FROM step_events WHERE typeof(detail_json) = 'blob' LIMIT 1"
        )[0]
        assert isinstance(raw, bytes)
        forged = pack(unpack(raw)[:-1] + ',"forged":1}')
        assert isinstance(forged, bytes) and unpack(forged) != unpack(raw)
        edit_past_trigger(
            _db(host),
            "step_events_no_update",
            "UPDATE step_events SET detail_json = ? WHERE id = ?",
            (forged, row_id),
        )
        report = audit.verify(host.context(), full=True)
        assert not report["ok"]
        named = [(p.get("table"), p.get("key"), p["problem"]) for p in report["problems"]]
        assert named == [("step_events", row_id, "content edited: row digest differs from its journal entry")]


class TestUpgradeTo0012:
    def test_steps_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0011_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.context(), full=True)["ok"]  # the checkpoint, among text rows
        assert _detail_forms(host) == {"text"}
        engine = make_engine(f"sqlite:///{_db(host)}")
        command.downgrade(alembic_config(engine), "0011")
        assert _raw(host, "SELECT version_num FROM alembic_version") == [("0011",)]
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        assert _detail_forms(host) == {"text", "blob"}
        incremental = audit.verify(host.context())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        assert audit.verify(host.context(), full=True)["ok"]

        before = _raw(host, "SELECT count(*), sum(typeof(detail_json) = 'blob') FROM step_events")
        command.downgrade(alembic_config(engine), "0011")  # the packed rows stay
        assert _raw(host, "SELECT count(*), sum(typeof(detail_json) = 'blob') FROM step_events") == before
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.context(), full=True)["ok"]
