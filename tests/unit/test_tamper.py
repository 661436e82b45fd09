"""A record nobody can quietly rewrite: every history table against every kind of rewrite.

The attacker here has the database file and sqlite3 (and, where it says so, the
head file), knows the chain's algorithm and uses anvil_ctl's own digest and hash
functions. Each rewrite is either refused by the database (the append-only
triggers, REPLACE included) or, once the attacker has dropped the triggers,
named by `anvilctl audit verify` with exit 6: the table and key of the row, or
the journal entry, and what happened to it.

One populated database (a row in every history table, written by anvil_ctl's own
write paths) is built once per module and copied for each case.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
from sqlalchemy import String, Text

from anvil_ctl import cli, log
from anvil_ctl.commands import audit as audit_cmd
from anvil_ctl.commands import recheck as recheck_cmd
from anvil_ctl.commands import transactions
from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.model import ShmMark
from anvil_ctl.core.states import ExitCode
from anvil_ctl.core.waiver import Waiver
from anvil_ctl.persistence import hosts, qualification, rechecks, waiver_rows
from anvil_ctl.persistence.audit import GENESIS, LINK_TAG, compact_digest, entry_hash
from anvil_ctl.persistence.coverage import COVERED, UncoveredRows, row_digest
from anvil_ctl.persistence.models import HISTORY_TABLES, RecheckRow
from anvil_ctl.persistence.shm_ledger import StoreShmLedger
from anvil_ctl.persistence.store import Store
from tests.unit.fakehost import FakeHost, make_fake_host, reopen

T0 = datetime(2026, 9, 2, 12, 0, tzinfo=UTC)

# The column an attacker would change, where one tells a story; elsewhere the last text column.
EDIT_COLUMN = {
    "waivers": "approved_by",
    "decisions": "outcome",
    "transaction_states": "state",
    "approvals": "approved_by",
    "identities": "container_id",
    "gpu_ownership_events": "container_id",
    "evidence_manifests": "sha256",
    "audit_checkpoints": "mode",
    "snapshot_blobs": "at",  # its one other column, the body, is compressed
}


def edit_column(table: str) -> str:
    if table in EDIT_COLUMN:
        return EDIT_COLUMN[table]
    t = COVERED[table]
    text_columns = [
        c.name
        for c in t.columns
        if isinstance(c.type, String | Text) and not c.primary_key and not c.foreign_keys
    ]
    return text_columns[-1]


def populate(host: FakeHost) -> None:
    """At least two rows in every history table (one in the middle of the chain), through
    anvil_ctl's own writes: adopt (make_fake_host), load, qualification records, waivers,
    approvals, rechecks, evidence manifests, verify checkpoints."""
    app = host.app()
    store = app.store
    out = transactions.load(app, slot="primary", candidate=host.candidate())
    assert out.tx_id is not None
    tx = out.tx_id
    StoreShmLedger(store).remember(
        [
            ShmMark(path=f"/dev/shm/nccl-{n}", dev=1, ino=n, container_id="c" * 64, boot_id="b")
            for n in (1, 2)
        ],
    )
    for n in (1, 2):
        qualification.record_evidence(
            store,
            tx,
            [{"name": f"gate-{n}", "passed": True, "artifact": f"0{n}.json", "sha256": "a" * 64, "size": 10}],
        )
        qualification.record_manifest(store, tx, f"{n}" * 64, kind="qualify")
        qualification.record_decision(
            store,
            decision_id=f"dec-{n}",
            tx_id=tx,
            slot="primary",
            identity_digest="i" * 64,
            container_id="c" * 64,
            outcome="failed",
            manifest_sha256=f"{n}" * 64,
        )
        waiver_rows.add_waiver(
            store,
            Waiver(
                id=f"w-{n}",
                policy="vram-reserve",
                value=0,
                approved_by="operator",
                reason="model-only pair",
                created_at=T0,
                roles=frozenset({"compute-a", "compute-b"}),
            ),
        )
        waiver_rows.revoke_waiver(store, f"w-{n}", by="operator", reason="done")
        qualification.record_approval(store, tx_id=tx, decision_id=f"dec-{n}", approved_by="operator")
        rechecks.record_recheck(
            store, slot="primary", passed=True, failed=[], assertions=[], snapshot_sha256="s" * 64
        )
        assert audit_cmd.verify(app)["ok"]
    # a second host of the fleet registered in the same database (the first is this one)
    second = Store(store.engine, head_path=store.head_path)
    hosts.attach(second, "second-host", machine_id="f" * 32, boot_id="b")
    second.register()
    recheck_cmd.recheck(app, "primary")  # an entry after the last checkpoint


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("populated")
    populate(make_fake_host(root))
    db = sqlite3.connect(root / "state" / "anvil.db")
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in HISTORY_TABLES}
    db.close()
    assert min(counts.values()) >= 2, counts
    return root


@pytest.fixture
def host(template: Path, tmp_path: Path) -> FakeHost:
    root = tmp_path / "host"
    shutil.copytree(template, root)
    return reopen(root)


@pytest.fixture
def verify(host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """`verify(*args)`: `anvilctl audit verify --json ARGS` on the host -> (exit code, report)."""
    monkeypatch.setattr(log, "configure", lambda *_a, **_k: None)
    for key, value in host.env().items():
        if key.startswith("ANVIL_"):
            monkeypatch.setenv(key, value)

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = cli.main(["audit", "verify", "--json", *args])
        out, err = capsys.readouterr()
        assert out.strip(), f"audit verify exited {code} without a report; stderr: {err[-2000:]}"
        return code, json.loads(out)

    return run


# -- the attacker ------------------------------------------------------------------------------


@dataclass
class Attacker:
    """sqlite3 on the database file, as anyone with write access to it has."""

    host: FakeHost

    @property
    def db(self) -> Path:
        return self.host.settings.state_dir / "anvil.db"

    @property
    def head_file(self) -> Path:
        return self.db.with_name("anvil.db.head")

    @contextmanager
    def sql(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.db)
        con.row_factory = sqlite3.Row
        try:
            yield con
            con.commit()
        finally:
            con.close()

    def drop_triggers(self) -> None:
        with self.sql() as con:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
            for name in names:
                con.execute(f"DROP TRIGGER {name}")

    def first_row(self, table: str) -> dict[str, Any]:
        with self.sql() as con:
            return dict(con.execute(f"SELECT * FROM {table} ORDER BY rowid LIMIT 1").fetchone())

    def last_row(self, table: str) -> dict[str, Any]:
        with self.sql() as con:
            return dict(con.execute(f"SELECT * FROM {table} ORDER BY rowid DESC LIMIT 1").fetchone())

    @staticmethod
    def pk(table: str) -> str:
        (column,) = COVERED[table].primary_key.columns
        return column.name

    def update(self, table: str, row: dict[str, Any], column: str, value: Any) -> None:
        with self.sql() as con:
            con.execute(
                f"UPDATE {table} SET {column} = ? WHERE {self.pk(table)} = ?", (value, row[self.pk(table)])
            )

    def delete(self, table: str, row: dict[str, Any]) -> None:
        with self.sql() as con:
            con.execute(f"DELETE FROM {table} WHERE {self.pk(table)} = ?", (row[self.pk(table)],))

    def replace(self, table: str, row: dict[str, Any], **changes: Any) -> None:
        values = {**row, **changes}
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.sql() as con:
            con.execute(f"INSERT OR REPLACE INTO {table} ({cols}) VALUES ({marks})", tuple(values.values()))

    def insert_copy(self, table: str, row: dict[str, Any]) -> None:
        """A new row like `row`: a new key, unique columns made unique."""
        t = COVERED[table]
        values = dict(row)
        pk = self.pk(table)
        if isinstance(values[pk], int):
            values[pk] += 1000  # a new key (`hosts.id` is a SMALLINT: SQLite does not choose one)
        else:
            values[pk] = f"forged-{table}"[:36]
        for c in t.columns:
            if c.unique and c.name in values:
                values[c.name] = f"forged-{c.name}"
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.sql() as con:
            con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(values.values()))

    # -- a consistent rewrite: digest, entry, every hash after it ------------------------------

    def entry_covering(self, con: sqlite3.Connection, table: str, key: Any) -> sqlite3.Row:
        for entry in con.execute("SELECT * FROM audit_journal ORDER BY id"):
            for t, k, _d in json.loads(entry["rows_json"]):
                if (t, k) == (table, key):
                    return entry
        raise AssertionError(f"no entry covers {table}:{key}")

    def _set_digest(self, con: sqlite3.Connection, table: str, key: Any) -> int:
        raw = con.execute(f"SELECT * FROM {table} WHERE {self.pk(table)} = ?", (key,)).fetchone()
        # The attacker knows the storage format: a compressed JSON body digests as its text.
        row = {k: zlib.decompress(v).decode() if isinstance(v, bytes) else v for k, v in dict(raw).items()}
        entry = self.entry_covering(con, table, key)
        refs = [
            [t, k, compact_digest(row_digest(COVERED[t], row)) if (t, k) == (table, key) else d]
            for t, k, d in json.loads(entry["rows_json"])
        ]
        con.execute(
            "UPDATE audit_journal SET rows_json = ? WHERE id = ?", (canonical_json(refs), entry["id"])
        )
        return int(entry["id"])

    @staticmethod
    def rehash_from(con: sqlite3.Connection, first: int) -> None:
        before = con.execute("SELECT hash FROM audit_journal WHERE id = ?", (first - 1,)).fetchone()
        prev = before[0] if before else GENESIS
        for e in con.execute("SELECT * FROM audit_journal WHERE id >= ? ORDER BY id", (first,)).fetchall():
            digest = entry_hash(prev, e)
            con.execute(
                "UPDATE audit_journal SET prev_hash = ?, hash = ? WHERE id = ?",
                (prev[:LINK_TAG], digest, e["id"]),
            )
            prev = digest

    def rewrite(self, table: str, key: Any, column: str, value: Any) -> None:
        """Edit one row and make everything inside the database agree again: its digest, its
        entry, every hash after it, and the checkpoints that pinned the old hashes."""
        with self.sql() as con:
            con.execute(f"UPDATE {table} SET {column} = ? WHERE {self.pk(table)} = ?", (value, key))
            self.rehash_from(con, self._set_digest(con, table, key))
            for cp in con.execute("SELECT id, seq FROM audit_checkpoints ORDER BY id").fetchall():
                now = con.execute("SELECT hash FROM audit_journal WHERE id = ?", (cp["seq"],)).fetchone()[0]
                con.execute("UPDATE audit_checkpoints SET hash = ? WHERE id = ?", (now, cp["id"]))
                self.rehash_from(con, self._set_digest(con, "audit_checkpoints", cp["id"]))

    def cut_tail_from_row(self, table: str, key: Any) -> int:
        """Remove the entry that covers `table:key` and everything after it, with the rows
        those entries cover: a database that looks as if those writes never happened."""
        with self.sql() as con:
            first = int(self.entry_covering(con, table, key)["id"])
            for e in con.execute("SELECT rows_json FROM audit_journal WHERE id >= ?", (first,)).fetchall():
                for t, k, _d in json.loads(e["rows_json"]):
                    con.execute(f"DELETE FROM {t} WHERE {self.pk(t)} = ?", (k,))
            con.execute("DELETE FROM audit_journal WHERE id >= ?", (first,))
            return first

    def cut_tail(self, n: int | None) -> None:
        with self.sql() as con:
            if n is None:
                con.execute("DELETE FROM audit_journal")
            else:
                con.execute(
                    "DELETE FROM audit_journal WHERE id > (SELECT max(id) FROM audit_journal) - ?", (n,)
                )


@pytest.fixture
def attacker(host: FakeHost) -> Attacker:
    return Attacker(host)


def problems_of(report: dict[str, Any], table: str | None = None) -> list[str]:
    return [p["problem"] for p in report["problems"] if table is None or p.get("table") == table]


def named(report: dict[str, Any], table: str, key: Any) -> list[str]:
    return [p["problem"] for p in report["problems"] if (p.get("table"), p.get("key")) == (table, key)]


TABLES = pytest.mark.parametrize("table", HISTORY_TABLES)


# -- the database refuses ----------------------------------------------------------------------


class TestTheDatabaseRefuses:
    """With its triggers in place, no history row can be changed, removed or replaced."""

    @TABLES
    def test_update_is_refused(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            attacker.update(table, row, edit_column(table), "FORGED")
        assert attacker.first_row(table) == row
        assert verify()[0] == ExitCode.OK

    @TABLES
    def test_delete_is_refused(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            attacker.delete(table, row)
        assert attacker.first_row(table) == row
        assert verify()[0] == ExitCode.OK

    @TABLES
    def test_insert_or_replace_is_refused(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            attacker.replace(table, row, **{edit_column(table): "FORGED"})
        assert attacker.first_row(table) == row
        assert verify()[0] == ExitCode.OK

    @pytest.mark.parametrize(
        ("table", "column"), [("lock_releases", "lock_id"), ("waiver_revocations", "waiver_id")]
    )
    def test_a_replace_through_a_unique_key_is_refused(
        self, table: str, column: str, attacker: Attacker, verify: Any
    ) -> None:
        row = attacker.first_row(table)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            attacker.replace(table, {**row, "id": 9999}, reason="FORGED")
        assert attacker.first_row(table) == row
        assert verify()[0] == ExitCode.OK

    def test_the_transaction_state_rewrite_of_the_issue_is_refused(
        self, attacker: Attacker, host: FakeHost, verify: Any
    ) -> None:
        committed = attacker.last_row("transaction_states")
        assert committed["state"] == "committed"
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            attacker.replace("transaction_states", committed, state="compensation_failed")
        assert attacker.last_row("transaction_states")["state"] == "committed"


# -- audit verify names it ---------------------------------------------------------------------


class TestAuditVerifyNamesARewrite:
    """With the triggers dropped, each rewrite of each table is named by `audit verify`, exit 6."""

    @TABLES
    def test_an_updated_row(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        attacker.drop_triggers()
        attacker.update(table, row, edit_column(table), "FORGED")
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert "content edited: row digest differs from its journal entry" in named(
            report, table, row[attacker.pk(table)]
        )
        assert report["checkpoint"] is None  # a failed verify records no checkpoint

    @TABLES
    def test_a_deleted_row(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        attacker.drop_triggers()
        attacker.delete(table, row)
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert "row deleted: covered by the journal, gone from its table" in named(
            report, table, row[attacker.pk(table)]
        )

    @TABLES
    def test_a_replaced_row(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.first_row(table)
        attacker.drop_triggers()
        attacker.replace(table, row, **{edit_column(table): "FORGED"})
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert "content edited: row digest differs from its journal entry" in named(
            report, table, row[attacker.pk(table)]
        )

    @TABLES
    def test_a_row_inserted_past_the_journal(self, table: str, attacker: Attacker, verify: Any) -> None:
        # INSERT passes the triggers (history grows); the chain does not cover the row.
        attacker.insert_copy(table, attacker.first_row(table))
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert any(
            p["problem"] == "row not covered by the journal (inserted outside anvilctl)"
            for p in report["problems"]
            if p.get("table") == table
        )

    @TABLES
    def test_the_tail_cut_back_to_a_row(self, table: str, attacker: Attacker, verify: Any) -> None:
        row = attacker.last_row(table)
        attacker.drop_triggers()
        first = attacker.cut_tail_from_row(table, row[attacker.pk(table)])
        code, report = verify("--full")
        assert code == ExitCode.DRIFT
        # Inside the database everything agrees; the head file outside it does not.
        assert [p for p in report["problems"] if "trigger" not in p["problem"]] == [
            p for p in report["problems"] if "tail cut" in p["problem"]
        ]
        (cut,) = [p for p in report["problems"] if "tail cut" in p["problem"]]
        assert f"the journal ends at entry {first - 1}" in cut["problem"]

    @TABLES
    def test_a_middle_row_edited_and_everything_rehashed(
        self, table: str, attacker: Attacker, host: FakeHost, verify: Any
    ) -> None:
        row = attacker.first_row(table)
        key = row[attacker.pk(table)]
        attacker.drop_triggers()
        attacker.rewrite(table, key, edit_column(table), "FORGED")
        code, report = verify("--full")
        assert code == ExitCode.DRIFT
        assert named(report, table, key) == []  # its digest agrees with its (rewritten) entry
        rewritten = [p["problem"] for p in report["problems"] if "journal rewritten" in p["problem"]]
        assert rewritten and "the head file" in rewritten[0]


class TestTheJournalTail:
    @pytest.mark.parametrize("n", [1, 5, None], ids=["last", "last-five", "every"])
    def test_entries_deleted_from_the_end_are_named(
        self, n: int | None, attacker: Attacker, verify: Any
    ) -> None:
        with attacker.sql() as con:
            last = con.execute("SELECT max(id) FROM audit_journal").fetchone()[0]
        attacker.drop_triggers()
        attacker.cut_tail(n)
        code, report = verify()
        assert code == ExitCode.DRIFT and report["ok"] is False
        end = 0 if n is None else last - n
        assert any(
            p["problem"].startswith(f"tail cut: the journal ends at entry {end} but the head file")
            for p in report["problems"]
        )

    def test_a_write_after_the_cut_leaves_the_head_file_as_evidence(
        self, attacker: Attacker, host: FakeHost, verify: Any
    ) -> None:
        recorded = attacker.head_file.read_text()
        attacker.drop_triggers()
        attacker.cut_tail(5)
        rechecks.record_recheck(
            host.app().store, slot="primary", passed=True, failed=[], assertions=[], snapshot_sha256=""
        )
        assert attacker.head_file.read_text() == recorded  # not moved past a cut it cannot vouch for
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert any("journal rewritten" in p or "tail cut" in p for p in problems_of(report))

    def test_a_missing_head_file_is_named(self, attacker: Attacker, verify: Any) -> None:
        attacker.head_file.unlink()
        code, report = verify()
        assert code == ExitCode.DRIFT
        assert any("head file" in p and "is missing" in p for p in problems_of(report))

    def test_a_head_file_behind_the_database_is_not_a_problem(self, attacker: Attacker, verify: Any) -> None:
        # A crash between a commit and the head file's update leaves it one entry behind.
        with attacker.sql() as con:
            seq, digest = con.execute("SELECT id, hash FROM audit_journal WHERE id = 3").fetchone()
        attacker.head_file.write_text(json.dumps({"seq": seq, "hash": digest}))
        code, report = verify()
        assert code == ExitCode.OK and report["head_file"]["behind"] > 0


class TestRecheckWitnessesTheHead:
    def test_the_head_after_its_own_record_is_in_its_result_and_its_log_line(self, host: FakeHost) -> None:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
        try:
            with structlog.testing.capture_logs() as logs:
                result = recheck_cmd.recheck(host.app(), "primary")
        finally:
            log.configure("console", "warning")
        head = host.app().store.head()
        assert result.audit_head == str(head)
        assert {"event": "audit.head", "seq": head.seq, "hash": head.hash, "log_level": "info"} in logs


class TestExpectHead:
    def test_a_head_witnessed_by_recheck_is_held(self, host: FakeHost, verify: Any, tmp_path: Path) -> None:
        result = recheck_cmd.recheck(host.app(), "primary")
        prom = tmp_path / "anvil.prom"
        recheck_cmd.write_textfile(prom, result, now=0.0)
        seq, _, digest = result.audit_head.partition(":")
        assert f'anvil_audit_head{{hash="{digest}"}} {float(seq)}' in prom.read_text()
        assert verify("--expect-head", result.audit_head)[0] == ExitCode.OK

    def test_a_rewrite_with_the_head_file_rewritten_too_is_named_against_the_witness(
        self, host: FakeHost, attacker: Attacker, verify: Any
    ) -> None:
        witnessed = recheck_cmd.recheck(host.app(), "primary").audit_head
        attacker.drop_triggers()
        attacker.rewrite("waivers", "w-1", "approved_by", "cfo")
        with attacker.sql() as con:
            seq, digest = con.execute(
                "SELECT id, hash FROM audit_journal ORDER BY id DESC LIMIT 1"
            ).fetchone()
        attacker.head_file.write_text(json.dumps({"seq": seq, "hash": digest}))
        code, report = verify("--full", "--expect-head", witnessed)
        assert code == ExitCode.DRIFT
        assert [p for p in problems_of(report) if "journal rewritten" in p and "--expect-head" in p]

    def test_a_head_beyond_the_journal_is_a_cut_tail(self, verify: Any) -> None:
        code, report = verify("--expect-head", f"100000:{'a' * 64}")
        assert code == ExitCode.DRIFT
        assert any(p.startswith("tail cut") and "--expect-head" in p for p in problems_of(report))

    @pytest.mark.parametrize("bad", ["12", "x:" + "a" * 64, "0:" + "a" * 64, "3:" + "A" * 64, "3:abc"])
    def test_a_malformed_head_is_bad_input(
        self, bad: str, verify: Any, capsys: pytest.CaptureFixture[str], attacker: Attacker
    ) -> None:
        with attacker.sql() as con:
            before = con.execute("SELECT count(*) FROM audit_journal").fetchone()[0]
        code = cli.main(["audit", "verify", "--expect-head", bad])
        err = capsys.readouterr().err
        assert code == ExitCode.BAD_INPUT
        assert err.count("\n") == 1 and "--expect-head" in err and "Traceback" not in err
        with attacker.sql() as con:
            assert con.execute("SELECT count(*) FROM audit_journal").fetchone()[0] == before


class TestEveryWriteIsCovered:
    def test_a_history_row_without_its_audit_entry_is_refused_at_commit(self, host: FakeHost) -> None:
        store = host.app().store
        with pytest.raises(UncoveredRows, match="rechecks"), store.write() as s:
            s.add(
                RecheckRow(
                    slot="primary",
                    passed=1,
                    failed_json="[]",
                    assertions_json="[]",
                    snapshot_sha256="",
                    at="t",
                )
            )
        assert audit_cmd.verify(host.app(), full=True)["ok"]

    def test_the_untouched_populated_database_verifies_in_both_modes(
        self, verify: Any, attacker: Attacker
    ) -> None:
        with attacker.sql() as con:
            rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in HISTORY_TABLES)
        code, full = verify("--full")
        assert code == ExitCode.OK and full["mode"] == "full" and full["escalated"] is None
        assert full["rows_checked"] == rows and full["entries_checked"] == full["entries"]
        code, incremental = verify()
        assert code == ExitCode.OK and incremental["escalated"] is None
        assert incremental["entries_checked"] == 1  # the full run's checkpoint entry
