"""Bytes per transaction (issue 13 point 3): evidence stored once.

- A transaction's before/after diff that is exactly the diff of its two stored snapshots
  is stored as `snapshots.DERIVED` and read back, by `audit diff`, as the same patch the
  older rows hold in full; rows of both forms read and verify together.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from anvil_ctl.commands import audit
from anvil_ctl.core.snapshot import Snapshot, diff, to_patch
from anvil_ctl.persistence import snapshots
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.test_lean_records import _cycle


def _raw(host: FakeHost, sql: str, *args: object) -> list[tuple[object, ...]]:
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    try:
        return [tuple(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def _diffs_by_tx(host: FakeHost) -> dict[str, list[tuple[object, ...]]]:
    out: dict[str, list[tuple[object, ...]]] = {}
    for tx_id, *rest in _raw(host, "SELECT tx_id, label, changes_json FROM snapshot_diffs ORDER BY id"):
        out.setdefault(str(tx_id), []).append(tuple(rest))
    return out


def _expected_patch(host: FakeHost, tx_id: str) -> list[object]:
    """The before/after patch worked out here from the transaction's two stored snapshots."""
    with host.context().store.read() as s:
        snaps = snapshots.of_transaction(s, tx_id)
    before, after = Snapshot(snaps["before"].body), Snapshot(snaps["after"].body)
    return list(to_patch(diff(before, after)))


class TestDerivedDiffs:
    def test_a_before_after_diff_is_stored_once_as_its_snapshots_and_reads_as_the_patch(
        self, tmp_path: Path
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        derived = [
            (tx, label)
            for tx, rows in _diffs_by_tx(host).items()
            for label, changes in rows
            if changes == snapshots.DERIVED
        ]
        assert derived and {label for _tx, label in derived} == {"before-after"}
        for tx, _label in derived:
            (shown,) = [d for d in audit.diff(host.context(), tx) if d["label"] == "before-after"]
            patch = _expected_patch(host, tx)
            assert patch and shown["patch"] == patch and shown["format"] == "json-patch"
            assert not shown["equal"] and len(shown["changes"]) == len(
                [op for op in patch if op["op"] != "test"]
            )
        # a rollback's recorded-restored diff compares placements, not stored snapshots: kept whole
        kept = [
            c for rows in _diffs_by_tx(host).values() for label, c in rows if label == "recorded-restored"
        ]
        assert kept and snapshots.DERIVED not in kept
        assert audit.verify(host.context(), full=True)["ok"]

    def test_diffs_stored_whole_and_derived_read_and_verify_together(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            m.setattr(snapshots, "_derivable", lambda *_a: False)  # as anvilctl wrote them before 0011
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        whole = {
            tx for tx, rows in _diffs_by_tx(host).items() if ("before-after", snapshots.DERIVED) not in rows
        }
        _cycle(host, 2)
        derived = {
            tx for tx, rows in _diffs_by_tx(host).items() if ("before-after", snapshots.DERIVED) in rows
        }
        assert whole and derived and not whole & derived
        for tx in whole | derived:
            (shown,) = [d for d in audit.diff(host.context(), tx) if d["label"] == "before-after"]
            assert shown["patch"] == _expected_patch(host, tx)
        report = audit.verify(host.context(), full=True)
        assert report["ok"] and report["rows"] > 0

    def test_a_derived_diff_whose_snapshot_was_rewritten_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        (sha,) = _raw(
            host,
            "SELECT after_sha256 FROM snapshot_diffs WHERE changes_json = ? ORDER BY id DESC LIMIT 1",
            snapshots.DERIVED,
        )[0]
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        trigger = "snapshot_blobs_no_update"
        (ddl,) = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (trigger,)).fetchone()
        con.execute(f"DROP TRIGGER {trigger}")
        con.execute("UPDATE snapshot_blobs SET body_json = '{\"forged\":1}' WHERE sha256 = ?", (sha,))
        con.execute(ddl)
        con.commit()
        con.close()
        report = audit.verify(host.context(), full=True)
        assert not report["ok"]
        assert [(p.get("table"), p.get("key")) for p in report["problems"]] == [("snapshot_blobs", sha)]
