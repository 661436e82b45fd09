"""Incremental `audit verify`: from the last checkpoint, and everything when it cannot trust it.

A clean verify records a checkpoint (a chain position and each covered table's
row count). The next one checks the entries after it and the rows they cover,
the counts, the schema and the head; it walks everything (and says why) when the
schema changed since, a table's count is off, the checkpoint is not covered by
the chain, or anything after it is wrong, so that the report names each row.
`--full` always walks everything.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import audit, transactions
from anvil_ctl.persistence import rechecks
from anvil_ctl.persistence.chainwalk import Refs
from anvil_ctl.persistence.models import HISTORY_TABLES
from tests.unit.fakehost import FakeHost


@contextmanager
def sql(host: FakeHost) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    con.row_factory = sqlite3.Row
    try:
        yield con
        con.commit()
    finally:
        con.close()


def entries(host: FakeHost) -> int:
    with sql(host) as con:
        return int(con.execute("SELECT max(id) FROM audit_journal").fetchone()[0])


def verify(host: FakeHost, **kw: Any) -> dict[str, Any]:
    return audit.verify(host.app(), **kw)


@pytest.fixture
def checked(fake_host: FakeHost) -> FakeHost:
    """A host whose journal one clean verify has checkpointed."""
    first = verify(fake_host)
    assert first["ok"] and first["escalated"] == "no checkpoint yet"
    return fake_host


class TestCheckpoints:
    def test_the_first_run_walks_everything_and_records_a_checkpoint_at_the_head(
        self, fake_host: FakeHost
    ) -> None:
        before = entries(fake_host)
        report = verify(fake_host)
        assert report["ok"] and report["escalated"] == "no checkpoint yet"
        assert report["entries_checked"] == before and report["head"].startswith(f"{before}:")
        assert report["checkpoint"]["head"] == report["head"]
        assert entries(fake_host) == before + 1  # the checkpoint's own entry

    def test_the_next_run_checks_only_what_came_after_it(self, checked: FakeHost) -> None:
        before = entries(checked)
        out = transactions.load(checked.app(), slot="primary", candidate=checked.candidate())
        assert out.state.value == "committed"
        new_entries = entries(checked) - before
        report = verify(checked)
        assert report["ok"] and report["escalated"] is None and report["mode"] == "incremental"
        # the entries after the checkpoint: its own, and the load's
        assert report["entries_checked"] == new_entries + 1
        with sql(checked) as con:
            covered = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in HISTORY_TABLES)
        assert 0 < report["rows_checked"] < covered
        assert report["started_from"]["head"].startswith(f"{before - 1}:")

    def test_full_walks_everything_even_with_a_checkpoint(self, checked: FakeHost) -> None:
        report = verify(checked, full=True)
        assert report["ok"] and report["mode"] == "full"
        assert report["entries_checked"] == report["entries"] == entries(checked) - 1

    def test_a_failed_run_records_no_checkpoint(self, checked: FakeHost) -> None:
        with sql(checked) as con:
            con.execute(
                "INSERT INTO rechecks (slot, passed, failed_json, assertions_json, snapshot_sha256, at, "
                "host_id) VALUES ('primary', 1, '[]', ?, '', 'forged', 1)",
                (zlib.compress(b"[]"),),
            )
            checkpoints = con.execute("SELECT count(*) FROM audit_checkpoints").fetchone()[0]
        assert not verify(checked)["ok"]
        with sql(checked) as con:
            assert con.execute("SELECT count(*) FROM audit_checkpoints").fetchone()[0] == checkpoints

    def test_a_read_only_copy_verifies_without_recording_a_checkpoint(self, checked: FakeHost) -> None:
        db = checked.settings.state_dir / "anvil.db"
        before = entries(checked)
        settings = checked.settings.model_copy(update={"state_db": f"sqlite:///file:{db}?mode=ro&uri=true"})
        report = audit.verify(App(settings=settings, env={}))
        assert report["ok"] and report["checkpoint"] is None
        assert "readonly" in report["checkpoint_error"]
        assert report["head_file"]["path"] == str(db) + ".head"
        assert entries(checked) == before


class TestWhenTheCheckpointCannotBeTrusted:
    def test_a_row_inserted_after_the_checkpoint_walks_everything_and_is_named(
        self, checked: FakeHost
    ) -> None:
        with sql(checked) as con:  # INSERT passes the triggers; the journal does not cover it
            con.execute(
                "INSERT INTO rechecks (slot, passed, failed_json, assertions_json, snapshot_sha256, at, "
                "host_id) VALUES ('primary', 1, '[]', ?, '', 'forged', 1)",
                (zlib.compress(b"[]"),),
            )
        report = verify(checked)
        assert not report["ok"]
        assert report["escalated"].startswith("rechecks holds")
        assert {
            "row_id": None,
            "table": "rechecks",
            "key": 1,
            "problem": ("row not covered by the journal (inserted outside anvilctl)"),
        } in report["problems"]

    def test_an_old_row_edited_with_the_triggers_put_back_walks_everything_and_is_named(
        self, checked: FakeHost
    ) -> None:
        rechecks.record_recheck(
            checked.app().store,
            slot="primary",
            passed=False,
            failed=["x"],
            assertions=[],
            snapshot_sha256="",
        )
        assert verify(checked)["ok"]  # checkpointed after the recheck row
        with sql(checked) as con:
            saved = con.execute(
                "SELECT name, sql FROM sqlite_master WHERE name LIKE 'rechecks_no_%'"
            ).fetchall()
            for name, _ in saved:
                con.execute(f"DROP TRIGGER {name}")
            con.execute("UPDATE rechecks SET passed = 1, failed_json = '[]'")
            for _, text in saved:
                con.execute(text)
        report = verify(checked)
        assert report["escalated"].startswith("the schema changed since checkpoint")
        assert any(
            p.get("table") == "rechecks" and p["problem"].startswith("content edited")
            for p in report["problems"]
        )

    def test_a_forged_checkpoint_is_not_trusted(self, checked: FakeHost) -> None:
        rechecks.record_recheck(
            checked.app().store,
            slot="primary",
            passed=False,
            failed=["x"],
            assertions=[],
            snapshot_sha256="",
        )
        with sql(checked) as con:
            (trigger,) = con.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'rechecks_no_update'"
            ).fetchone()
            con.execute("DROP TRIGGER rechecks_no_update")
            con.execute("UPDATE rechecks SET passed = 1")
            con.execute(trigger)
            # A checkpoint at the head that agrees with everything the database says now.
            seq, digest = con.execute(
                "SELECT id, hash FROM audit_journal ORDER BY id DESC LIMIT 1"
            ).fetchone()
            version = con.execute("PRAGMA schema_version").fetchone()[0]
            counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in HISTORY_TABLES}
            counts["audit_checkpoints"] += 1
            con.execute(
                "INSERT INTO audit_checkpoints (seq, hash, schema_version, counts_json, mode, "
                "entries_checked, rows_checked, at, host_id) VALUES (?, ?, ?, ?, 'full', 0, 0, 'forged', 1)",
                (seq, digest, version, json.dumps(counts)),
            )
        report = verify(checked)
        assert report["escalated"].endswith("is not covered by an entry after its position")
        assert any(
            p.get("table") == "rechecks" and "content edited" in p["problem"] for p in report["problems"]
        )
        assert any(
            p.get("table") == "audit_checkpoints" and "not covered" in p["problem"]
            for p in report["problems"]
        )


class TestCost:
    def test_an_incremental_run_reads_no_row_the_checkpoint_covers(self, checked: FakeHost) -> None:
        out = transactions.load(checked.app(), slot="primary", candidate=checked.candidate())
        assert out.state.value == "committed", out.reason
        for _ in range(20):
            rechecks.record_recheck(
                checked.app().store,
                slot="primary",
                passed=True,
                failed=[],
                assertions=[],
                snapshot_sha256="",
            )
        full = verify(checked, full=True)
        incremental = verify(checked)
        assert incremental["escalated"] is None
        assert incremental["entries_checked"] == 1 and incremental["rows_checked"] == 1
        assert full["rows_checked"] > 50


class TestTheRefIndex:
    """What a full walk holds per covered row: dense integer keys in arrays, the rest in a dict."""

    D1, D2 = bytes(range(16)), bytes(range(1, 17))

    def test_keys_come_back_with_their_digest_and_entry_once(self) -> None:
        refs = Refs()
        for key in range(1, 5001):
            assert refs.add(key, self.D1, key + 10) is None
        assert refs.add("tx-1", self.D2, 7) is None
        assert len(refs) == 5001 and 4000 in refs and "tx-1" in refs
        assert refs.pop(4000) == (self.D1, 4010) and refs.pop(4000) is None
        assert refs.pop("tx-1") == (self.D2, 7)
        assert len(refs) == 4999 and 4000 not in refs

    def test_a_second_ref_to_a_key_names_the_first_entry(self) -> None:
        refs = Refs()
        refs.add(3, self.D1, 11)
        refs.add("k", self.D1, 12)
        assert refs.add(3, self.D2, 20) == 11
        assert refs.add("k", self.D2, 21) == 12

    def test_what_is_left_is_listed_and_a_far_key_stays_sparse(self) -> None:
        refs = Refs()
        refs.add(2, self.D1, 5)
        refs.add(10**12, self.D2, 6)  # a forged key far beyond the rows: no giant array
        refs.add(-1, self.D2, 7)
        assert sorted(refs.items(), key=str) == sorted([(2, 5), (10**12, 6), (-1, 7)], key=str)
        assert refs.pop(10**12) == (self.D2, 6)
