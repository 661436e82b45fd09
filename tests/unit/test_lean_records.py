"""Lean records: large JSON bodies packed at rest, compact row digests, a rollback's arguments
name their snapshot.

- `PackedJSON` stores a large body as a compressed BLOB on SQLite and reads it back as
  the same text; small bodies stay text.
- A database holding rows written before packing (text, hex row digests in the journal)
  and after (BLOBs, base64url digests) verifies in both modes, and a packed row edited
  afterwards is named.
- The record step of a load, promote and rollback (identities, GPU ownership, approval)
  commits in one database transaction and one audit entry.
- A rollback journals the SHA-256 of the snapshot it must restore, not its body, and
  the record holds that body; one journaled with the body (before migration 0008)
  still rebuilds and verifies its placement against it.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from anvil_ctl.commands import audit, lifecycle, transactions
from anvil_ctl.persistence import audit as audit_chain
from anvil_ctl.persistence import coltypes
from anvil_ctl.persistence.coltypes import PACKED_DICT, pack, unpack
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, verify_after_edit
from tests.unit.rawjournal import JournalRow
from tests.unit.test_projection import SLOT, _verified


def _cycle(host: FakeHost, n: int) -> None:
    transactions.load(host.app(), slot=SLOT, candidate=host.candidate(name=f"c{n}"))
    _verified(host, n)
    assert lifecycle.promote(host.app(), slot=SLOT, approved_by="op").state.value == "committed"
    assert lifecycle.rollback(host.app(), slot=SLOT).state.value == "committed"


def _db(host: FakeHost) -> sqlite3.Connection:
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    con.row_factory = JournalRow
    return con


def _storage_types(host: FakeHost, table: str, column: str) -> set[str]:
    con = _db(host)
    try:
        return {r[0] for r in con.execute(f"SELECT DISTINCT typeof({column}) FROM {table}")}
    finally:
        con.close()


def _digest_lengths(host: FakeHost) -> set[int]:
    con = _db(host)
    try:
        return {
            len(d)
            for (rows,) in con.execute("SELECT rows_json FROM audit_journal")
            for _t, _k, d in json.loads(rows)
        }
    finally:
        con.close()


class TestPackedJSON:
    def test_a_large_body_packs_smaller_and_unpacks_to_the_same_text(self) -> None:
        text = json.dumps({"slots": {f"s{i}": {"status": "running"} for i in range(50)}})
        packed = pack(text)
        assert isinstance(packed, bytes) and packed.startswith(PACKED_DICT)
        assert len(packed) < len(text.encode()) and unpack(packed) == text

    def test_a_small_body_stays_text(self) -> None:
        assert pack('{"a":1}') == '{"a":1}'

    def test_a_blob_that_is_not_packed_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not a packed JSON body"):
            unpack(b"{}")

    def test_snapshot_bodies_are_blobs_at_rest_and_read_as_snapshots(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert _storage_types(host, "snapshot_blobs", "body_json") == {"blob"}
        app = host.app()
        con = _db(host)
        tx_id = con.execute("SELECT id FROM transactions WHERE kind = 'rollback'").fetchone()[0]
        con.close()
        snaps = app.store.snapshots(tx_id)
        assert set(snaps) >= {"before", "after"}
        assert all(s.sha256 and isinstance(s.body, dict) for s in snaps.values())


class TestTextAndPackedRowsTogether:
    def test_a_database_with_rows_of_both_formats_verifies_full_and_incremental(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:  # what an older anvilctl wrote: text, hex digests
            m.setattr(coltypes, "MIN_PACKED", 10**9)
            m.setattr(audit_chain, "compact_digest", lambda digest: digest)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        assert _storage_types(host, "snapshot_blobs", "body_json") == {"text"}
        assert audit.verify(host.app(), full=True)["ok"]
        _cycle(host, 2)
        assert _storage_types(host, "snapshot_blobs", "body_json") == {"text", "blob"}
        assert _storage_types(host, "transactions", "args_json") == {"text", "blob"}
        assert _digest_lengths(host) == {22, 64}  # 16-byte digests from 0011 on (test_lean_bytes)
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and not incremental["escalated"]
        assert audit.verify(host.app(), full=True)["ok"]

    def test_a_packed_row_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        con = _db(host)
        sha, raw = con.execute("SELECT sha256, body_json FROM snapshot_blobs LIMIT 1").fetchone()
        con.close()
        assert isinstance(raw, bytes)
        edited = pack(unpack(raw)[:-1] + ',"forged":1}')
        assert isinstance(edited, bytes) and unpack(edited) != unpack(raw)
        report = verify_after_edit(
            host,
            "snapshot_blobs_no_update",
            "UPDATE snapshot_blobs SET body_json = ? WHERE sha256 = ?",
            (edited, sha),
        )
        named = [p for p in report["problems"] if p.get("table") == "snapshot_blobs"]
        assert [(p["key"], p["problem"]) for p in named] == [(sha, EDITED)]


class TestRollbackArguments:
    def test_a_rollback_journals_its_snapshot_by_sha256_and_the_record_holds_the_body(
        self, tmp_path: Path
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        app = host.app()
        con = _db(host)
        tx_id = con.execute("SELECT id FROM transactions WHERE kind = 'rollback'").fetchone()[0]
        con.close()
        args = app.store.record(tx_id).args
        assert args.get("recorded_snapshot") is None
        sha = args["recorded_sha256"]
        assert isinstance(sha, str) and len(sha) == 64
        body = app.store.snapshot_body(sha)
        assert body is not None and SLOT in body["slots"]  # type: ignore[operator]

    def test_an_unknown_sha256_has_no_body(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        assert host.app().store.snapshot_body("0" * 64) is None


class TestRecordStepsCommitAsOne:
    @pytest.mark.parametrize("kind", ["load", "promote", "rollback"])
    def test_a_record_steps_identity_and_ownership_rows_share_one_audit_entry(
        self, tmp_path: Path, kind: str
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        con = _db(host)
        try:
            tx_id = con.execute(
                "SELECT id FROM transactions WHERE kind = ? ORDER BY created_at DESC LIMIT 1", (kind,)
            ).fetchone()[0]
            covering = [
                {t for t, _k, _d in json.loads(rows)}
                # the journal keeps a transaction's ID as its 16 bytes (0011: coltypes.CompactUuid)
                for (rows,) in con.execute(
                    "SELECT rows_json FROM audit_journal WHERE tx_id = ?", (uuid.UUID(tx_id).bytes,)
                )
            ]
        finally:
            con.close()
        other = "approvals" if kind == "promote" else "gpu_ownership_events"
        records = [tables for tables in covering if other in tables]
        assert len(records) == 1, covering  # the record step's rows: one entry
        assert "identities" in records[0]
