"""Lean history rows (issue 13 point 3, bytes per transaction): migrations 0012-0014.

- Migration 0012: a step's detail of 128 bytes or more is stored packed on SQLite
  (`coltypes.PackedDetail`, a BLOB tagged `00 7a`) when that is smaller, and read back as
  the text its row digest covers; small details stay text. Steps written before (text)
  and after verify together, in full and from a checkpoint across a downgrade to 0011
  and an upgrade, and a packed detail edited past the trigger is named by table and key.
- Migration 0013: on SQLite the `at` of the many-row history tables no README query
  compares as text is stored as 8 bytes (`coltypes.CompactTime`) and read back as the text
  the row digest covers; `v_steps` shows it as that text; the projection rebuilt from
  history still matches the maintained one; a compact time edited is named; rows with text
  times (written before) and compact ones verify together across a downgrade to 0012 and an
  upgrade, the downgrade's `v_steps` showing the stored value and the upgrade's the text.
- Migration 0014: on SQLite a GPU ownership event's container ID is stored as its 32 bytes
  and its transaction ID as 16, read back as text; a transaction's events are found in both
  forms (what its undo works from), the projection rebuilt from them matches, and an event's
  container rewritten is named.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from alembic import command

from anvil_ctl.commands import audit
from anvil_ctl.persistence import coltypes, gpu_ledger
from anvil_ctl.persistence.coltypes import PACKED_DICT, pack, time_of, unpack
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, named, raw_rows, verify_after_edit
from tests.unit.test_lean_records import _cycle

TX_OF = "coalesce(tx_id, (SELECT s.tx_id FROM transaction_states s WHERE s.id = tx_ref))"
"""SQL: a step row's transaction ID, named by `tx_id` or (from migration 0016 on) `tx_ref`."""


def _detail_forms(host: FakeHost) -> set[object]:
    return {t for (t,) in raw_rows(host, "SELECT DISTINCT typeof(detail_json) FROM step_events")}


def _the_0011_way(m: pytest.MonkeyPatch) -> None:
    """Write step details as anvilctl at 0011 did: text."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(coltypes.PackedDetail, "process_bind_param", as_text)


class TestPackedStepDetail:
    def test_large_details_are_packed_and_read_back_as_the_same_steps(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        packed = raw_rows(
            host,
            f"SELECT id, {TX_OF}, step, phase, event, detail_json FROM step_events"
            " WHERE typeof(detail_json) = 'blob'",
        )
        steps = {str(step) for _i, _t, step, _p, _e, _d in packed}
        assert {"release-vram", "vram-after-acceptance"} <= steps, steps
        for *_row, raw in packed:
            assert isinstance(raw, bytes) and raw.startswith(PACKED_DICT)  # 0015 on (test_lean_dictionary)
            assert len(raw) < len(unpack(raw).encode())
        assert raw_rows(host, "SELECT count(*) FROM step_events WHERE typeof(detail_json) = 'text'")[0][0] > 0
        # the Store reads them as the detail written: the rows' decoded text, parsed
        _id, tx_id, step, phase, name, raw = packed[-1]
        assert isinstance(raw, bytes)
        events = host.app().store.step_events(str(tx_id))
        (event,) = [e for e in events if (e.step, e.phase, e.event) == (step, phase, name)]
        assert event.detail == json.loads(unpack(raw))
        shown = audit.show(host.app(), str(tx_id))
        assert any(s["detail"] == event.detail for s in shown["steps"])
        assert audit.verify(host.app(), full=True)["ok"]

    def test_a_packed_detail_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(
            host, "SELECT id, detail_json FROM step_events WHERE typeof(detail_json) = 'blob' LIMIT 1"
        )[0]
        assert isinstance(raw, bytes)
        forged = pack(unpack(raw)[:-1] + ',"forged":1}')
        assert isinstance(forged, bytes) and unpack(forged) != unpack(raw)
        report = verify_after_edit(
            host,
            "step_events_no_update",
            "UPDATE step_events SET detail_json = ? WHERE id = ?",
            (forged, row_id),
        )
        assert named(report) == [("step_events", row_id, EDITED)]


class TestUpgradeTo0012:
    def test_steps_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0011_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among text rows
        assert _detail_forms(host) == {"text"}
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0011")
        assert raw_rows(host, "SELECT version_num FROM alembic_version") == [("0011",)]
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        assert _detail_forms(host) == {"text", "blob"}
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        assert audit.verify(host.app(), full=True)["ok"]

        before = raw_rows(host, "SELECT count(*), sum(typeof(detail_json) = 'blob') FROM step_events")
        command.downgrade(alembic_config(engine), "0011")  # the packed rows stay
        assert raw_rows(host, "SELECT count(*), sum(typeof(detail_json) = 'blob') FROM step_events") == before
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.app(), full=True)["ok"]


COMPACT_TIMES = (
    "step_events",
    "transaction_states",
    "gpu_ownership_events",
    "snapshots",
    "snapshot_blobs",
    "snapshot_diffs",
    "identity_bodies",
    "lock_releases",
    "approvals",
)
ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"


def _time_forms(host: FakeHost, table: str) -> set[object]:
    return {t for (t,) in raw_rows(host, f"SELECT DISTINCT typeof(at) FROM {table}")}


def _the_0012_way(m: pytest.MonkeyPatch) -> None:
    """Write times as text, as anvilctl at 0012 did (the journal's too, as before 0011)."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(coltypes.CompactTime, "process_bind_param", as_text)


class TestCompactTimes:
    def test_history_times_are_8_bytes_at_rest_and_read_back_as_their_text(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        for table in COMPACT_TIMES:
            assert _time_forms(host, table) == {"blob"}, table
        assert _time_forms(host, "identities") == {"text"}  # v_identities.recorded_at
        assert {t for (t,) in raw_rows(host, "SELECT DISTINCT typeof(created_at) FROM transactions")} == {
            "text"
        }  # ordered by
        # v_steps shows each as the text the Store reads (README: "... at from v_steps ...")
        stored = raw_rows(host, f"SELECT {TX_OF}, at FROM step_events ORDER BY id")
        shown = raw_rows(host, "SELECT tx_id, at FROM v_steps")
        assert len(shown) == len(stored) > 0
        assert shown == [(tx, time_of(at)) for tx, at in stored if isinstance(at, bytes)]
        tx_id = str(stored[-1][0])
        events = host.app().store.step_events(tx_id)
        assert [e.at for e in events] == [at for tx, at in shown if tx == tx_id]
        assert all(re.match(ISO, e.at) for e in events)
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []

    def test_a_compact_time_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(host, "SELECT id, at FROM transaction_states ORDER BY id DESC LIMIT 1")[0]
        assert isinstance(raw, bytes) and len(raw) == 8
        earlier = (int.from_bytes(raw, "big") - 3_600_000_000).to_bytes(8, "big")  # an hour back
        report = verify_after_edit(
            host,
            "transaction_states_no_update",
            "UPDATE transaction_states SET at = ? WHERE id = ?",
            (earlier, row_id),
        )
        assert named(report) == [("transaction_states", row_id, EDITED)]


class TestUpgradeTo0013:
    def test_times_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0012_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among text rows
        assert _time_forms(host, "step_events") == {"text"}
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0012")
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        for table in COMPACT_TIMES:
            assert _time_forms(host, table) == {"text", "blob"}, table
        shown = raw_rows(host, "SELECT at FROM v_steps")
        assert shown and all(isinstance(at, str) and re.match(ISO, at) for (at,) in shown)
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        full = audit.verify(host.app(), full=True)
        assert full["ok"] and full["projection_differs"] == []

        before = raw_rows(host, "SELECT count(*), sum(typeof(at) = 'blob') FROM step_events")
        command.downgrade(alembic_config(engine), "0012")  # the compact rows stay, shown as stored
        assert raw_rows(host, "SELECT count(*), sum(typeof(at) = 'blob') FROM step_events") == before
        assert {type(at) for (at,) in raw_rows(host, "SELECT at FROM v_steps")} == {str, bytes}
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.app(), full=True)["ok"]


def _the_0013_way(m: pytest.MonkeyPatch) -> None:
    """Write GPU ownership events' IDs as text, as anvilctl at 0013 did (and the journal's
    transaction IDs, as before 0011)."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(coltypes.HexDigest, "process_bind_param", as_text)
    m.setattr(coltypes.CompactUuid, "process_bind_param", as_text)


def _gpu_forms(host: FakeHost) -> set[tuple[object, ...]]:
    return set(
        raw_rows(host, "SELECT DISTINCT typeof(container_id), typeof(tx_id) FROM gpu_ownership_events")
    )


class TestCompactGpuEvents:
    def test_ids_are_bytes_at_rest_and_a_transactions_events_read_back_in_both_forms(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0013_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        assert _gpu_forms(host) == {("text", "text")}
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0013")
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        _cycle(host, 2)
        assert _gpu_forms(host) == {("text", "text"), ("blob", "blob")}
        sizes = raw_rows(
            host,
            "SELECT DISTINCT length(container_id), length(tx_id) FROM gpu_ownership_events"
            " WHERE typeof(tx_id) = 'blob'",
        )
        assert sizes == [(32, 16)]
        for form in ("text", "blob"):
            raw_tx, raw_container = raw_rows(
                host,
                "SELECT tx_id, container_id FROM gpu_ownership_events WHERE typeof(tx_id) = ?"
                " ORDER BY id DESC LIMIT 1",
                form,
            )[0]
            assert isinstance(raw_tx, str | bytes) and isinstance(raw_container, str | bytes)
            tx_id = raw_tx if isinstance(raw_tx, str) else str(uuid.UUID(bytes=raw_tx))
            container = raw_container if isinstance(raw_container, str) else raw_container.hex()
            events = gpu_ledger.transaction_events(host.app().store, tx_id)
            assert events and {e.tx_id for e in events} == {tx_id}, form
            assert container in {e.container_id for e in events}
            assert all(len(e.container_id) == 64 for e in events)
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []
        assert audit.verify(host.app())["ok"]

    def test_a_compact_container_id_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(
            host, "SELECT id, container_id FROM gpu_ownership_events ORDER BY id DESC LIMIT 1"
        )[0]
        assert isinstance(raw, bytes) and len(raw) == 32
        report = verify_after_edit(
            host,
            "gpu_ownership_events_no_update",
            "UPDATE gpu_ownership_events SET container_id = ? WHERE id = ?",
            (bytes(32), row_id),
        )
        assert named(report) == [("gpu_ownership_events", row_id, EDITED)]
