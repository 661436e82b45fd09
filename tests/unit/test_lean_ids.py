"""Compact IDs (issue 13, bytes per transaction): migration 0018.

- On SQLite a lean journal entry's `prev_hash` (8 hex digits) is stored as 4 bytes, a
  transaction's `owner_boot_id` and a lock's `boot_id` as 16, a snapshot row's `sha256` and
  a diff's `before_sha256`/`after_sha256` as 32; each reads back as the text its row digest
  (or entry hash) covers: the Store's snapshots and diffs, the owner, the projection.
- A compact snapshot reference edited past the trigger is named; values that would not read
  back the same stay text.
- Rows and entries written before (text) and after verify together, in full and from a
  checkpoint, across a downgrade to 0017 and an upgrade; the downgrade keeps every row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from anvil_ctl.commands import audit
from anvil_ctl.persistence import queries, snapshots
from anvil_ctl.persistence.coltypes import CompactUuid, HexDigest, LinkTag
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, named, raw_rows, verify_after_edit
from tests.unit.test_lean_records import _cycle

SQLITE = sqlite_dialect()
FORMS = {
    "audit_journal": ("prev_hash", 4),
    "transactions": ("owner_boot_id", 16),
    "locks": ("boot_id", 16),
    "snapshots": ("sha256", 32),
    "snapshot_diffs": ("after_sha256", 32),
}


def _forms(host: FakeHost, table: str) -> set[tuple[object, object]]:
    column, _size = FORMS[table]
    return set(raw_rows(host, f"SELECT typeof({column}), length({column}) FROM {table}"))


def _the_0017_way(m: pytest.MonkeyPatch) -> None:
    """Write as anvilctl at 0017 did: these IDs as text (and with them the other compact
    IDs, as anvilctl did before 0011 and 0014: those forms verify alike)."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    for kind in (LinkTag, CompactUuid, HexDigest):
        m.setattr(kind, "process_bind_param", as_text)


class TestLinkTag:
    @pytest.mark.parametrize("value", ["0a1b2c3d", "0A1B2C3D", "0" * 64, "xyz", "0a1b2c3d4"])
    def test_a_link_tag_reads_back_as_it_was_given(self, value: str) -> None:
        stored = LinkTag().process_bind_param(value, SQLITE)
        assert isinstance(stored, bytes) == (value == "0a1b2c3d")
        assert LinkTag().process_result_value(stored, SQLITE) == value


class TestCompactIds:
    def test_ids_are_bytes_at_rest_and_read_back_as_text(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        for table, (_column, size) in FORMS.items():
            assert _forms(host, table) == {("blob", size)}, table
        app = host.app()
        ((tx_id,),) = raw_rows(host, "SELECT id FROM transactions WHERE kind = 'rollback'")
        tx = str(tx_id)
        snaps = app.store.snapshots(tx)
        assert {"before", "after"} <= set(snaps) and all(len(s.sha256) == 64 for s in snaps.values())
        diffs = queries.snapshot_diffs(app.store, tx)
        assert diffs
        with app.store.read() as session:  # each names a stored snapshot by its text
            for d in diffs:
                for sha in (d["before_sha256"], d["after_sha256"]):
                    assert snapshots.body_by_sha256(session, sha) is not None
        assert app.store.record(tx).owner.boot_id == _boot_text(host, tx)
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []

    def test_a_compact_snapshot_reference_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(host, "SELECT id, sha256 FROM snapshots ORDER BY id DESC LIMIT 1")[0]
        assert isinstance(raw, bytes) and len(raw) == 32
        report = verify_after_edit(
            host,
            "snapshots_no_update",
            "UPDATE snapshots SET sha256 = ? WHERE id = ?",
            (bytes(32), row_id),
        )
        assert named(report) == [("snapshots", row_id, EDITED)]


def _boot_text(host: FakeHost, tx_id: str) -> str:
    ((raw,),) = raw_rows(host, "SELECT owner_boot_id FROM transactions WHERE id = ?", tx_id)
    return str(CompactUuid().process_result_value(raw, SQLITE))


class TestUpgradeTo0018:
    def test_ids_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0017_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among text rows
        for table in FORMS:
            assert {t for t, _n in _forms(host, table)} == {"text"}, table
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0017")
        assert raw_rows(host, "SELECT version_num FROM alembic_version") == [("0017",)]
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        for table, (_column, size) in FORMS.items():
            assert ("blob", size) in _forms(host, table) and {t for t, _n in _forms(host, table)} == {
                "text",
                "blob",
            }, table
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []
        old = str(
            raw_rows(host, "SELECT id FROM transactions WHERE kind = 'rollback' ORDER BY created_at")[0][0]
        )
        assert set(host.app().store.snapshots(old)) >= {"before", "after"}

        stored = "SELECT * FROM snapshots ORDER BY id"
        before = raw_rows(host, stored)
        command.downgrade(alembic_config(engine), "0017")  # the compact rows stay
        assert raw_rows(host, stored) == before
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.app(), full=True)["ok"]
