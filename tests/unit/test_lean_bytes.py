"""Bytes per transaction (issue 13 point 3): evidence stored once.

- A transaction's before/after diff that is exactly the diff of its two stored snapshots
  is stored as `snapshots.DERIVED` and read back, by `audit diff`, as the same patch the
  older rows hold in full; rows of both forms read and verify together.
- An entry lists each covered row by the first 16 bytes of its SHA-256 (22 base64url
  characters, packed under `rowrefs.SHORT_TAG`); entries listing all 32 bytes (0010) or
  hex (before) verify with them, and a row edited under a short digest is named.
- On SQLite an entry's time is stored as 8 bytes and its transaction ID as 16
  (`coltypes.CompactTime`, `CompactUuid`), read back as the text the hash covers; entries
  with text verify with them, and a compact value rewritten is named.
- A `batch` entry leaves out the events whose own rows name them (it lists the rows in
  order); an event with a payload, or with no row of its own, is still written out.
- A new snapshot body is stored as a delta against the transaction's earlier snapshot's
  whole body when that is at most half the size (`blobdelta`); every blob reads back as
  the body its SHA-256 names, whole blobs written before read with deltas, and a delta's
  base rewritten is named by verify.
- Migration 0011: a database written the 0010 way (whole 32-byte digests, text times and
  IDs, whole blobs and diffs), with a checkpoint among those rows, downgraded to 0010 and
  upgraded, then written to by this code, verifies from the checkpoint and in full; the
  index 0011 drops comes back on a downgrade, and rows in the new forms stay.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from anvil_ctl.commands import audit
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.snapshot import Snapshot, diff, to_patch
from anvil_ctl.persistence import audit as audit_chain
from anvil_ctl.persistence import blobdelta, coltypes, snapshots
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from anvil_ctl.persistence.rowrefs import SHORT_TAG, TAG, Unpackable, pack_rows, unpack_rows
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, raw_rows, verify_after_edit
from tests.unit.rawjournal import JournalRow
from tests.unit.test_lean_records import _cycle


def _diffs_by_tx(host: FakeHost) -> dict[str, list[tuple[object, ...]]]:
    out: dict[str, list[tuple[object, ...]]] = {}
    for tx_id, *rest in raw_rows(host, "SELECT tx_id, label, changes_json FROM snapshot_diffs ORDER BY id"):
        out.setdefault(str(tx_id), []).append(tuple(rest))
    return out


def _expected_patch(host: FakeHost, tx_id: str) -> list[object]:
    """The before/after patch worked out here from the transaction's two stored snapshots."""
    with host.app().store.read() as s:
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
            (shown,) = [d for d in audit.diff(host.app(), tx) if d["label"] == "before-after"]
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
        assert audit.verify(host.app(), full=True)["ok"]

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
            (shown,) = [d for d in audit.diff(host.app(), tx) if d["label"] == "before-after"]
            assert shown["patch"] == _expected_patch(host, tx)
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["rows"] > 0

    def test_a_derived_diff_whose_snapshot_was_rewritten_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        (sha,) = raw_rows(
            host,
            "SELECT after_sha256 FROM snapshot_diffs WHERE changes_json = ? ORDER BY id DESC LIMIT 1",
            snapshots.DERIVED,
        )[0]
        if isinstance(sha, bytes):  # 32 bytes from 0018 on; the blob's key stays text
            sha = coltypes.digest_of(sha)
        report = verify_after_edit(
            host,
            "snapshot_blobs_no_update",
            "UPDATE snapshot_blobs SET body_json = '{\"forged\":1}' WHERE sha256 = ?",
            (sha,),
        )
        assert [(p.get("table"), p.get("key")) for p in report["problems"]] == [("snapshot_blobs", sha)]


SHORT = "0guvJ3yr4TApTTvm4pA6WQ"
LONG = "0guvJ3yr4TApTTvm4pA6WTSktdgSk2WWrrBnml4yDuU"


def _journal(host: FakeHost) -> list[JournalRow]:
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    con.row_factory = JournalRow
    try:
        rows: list[JournalRow] = con.execute("SELECT id, rows_json FROM audit_journal ORDER BY id").fetchall()
        return rows
    finally:
        con.close()


def _digest_lengths(host: FakeHost) -> set[int]:
    return {len(d) for e in _journal(host) for _t, _k, d in json.loads(str(e["rows_json"]))}


class TestShortRowDigests:
    def test_a_list_of_short_digests_packs_under_its_own_tag_and_reads_back_the_same(self) -> None:
        text = audit_chain.canonical_json([["step_events", 7, SHORT], ["transactions", "dec-1", SHORT]])
        packed = pack_rows(text)
        assert packed.startswith(SHORT_TAG) and unpack_rows(packed) == text
        assert len(packed) == 2 + (1 + 1 + 16) + (1 + 6 + 16)
        assert pack_rows(text.replace(SHORT, LONG)).startswith(TAG)
        with pytest.raises(Unpackable):  # digests of both sizes in one list stay text
            pack_rows(audit_chain.canonical_json([["step_events", 7, SHORT], ["step_events", 8, LONG]]))

    def test_digest_bytes_reads_every_form_and_refuses_others(self) -> None:
        assert len(audit_chain.digest_bytes(SHORT)) == 16
        assert len(audit_chain.digest_bytes(LONG)) == 32
        assert len(audit_chain.digest_bytes("ab" * 32)) == 32
        for bad in ("", SHORT[:-1], LONG + "A", "zz" * 32):
            with pytest.raises(ValueError):
                audit_chain.digest_bytes(bad)

    def test_new_entries_list_16_bytes_and_verify_with_older_32_byte_and_hex_entries(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:  # as anvilctl wrote before 0010: hex digests
            m.setattr(audit_chain, "compact_digest", lambda digest: digest)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        with monkeypatch.context() as m:  # as 0010 wrote: all 32 bytes
            m.setattr(audit_chain, "ROW_DIGEST_BYTES", 32)
            _cycle(host, 2)
        assert audit.verify(host.app(), full=True)["ok"]  # a checkpoint among the older entries
        _cycle(host, 3)
        assert _digest_lengths(host) == {64, 43, 22}
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and incremental["rows"] > 0
        full = audit.verify(host.app(), full=True)
        assert full["ok"] and full["rows"] > incremental["rows"]

    @pytest.mark.parametrize("full", [True, False])
    def test_a_row_edited_under_a_short_digest_is_named_with_its_entry(
        self, tmp_path: Path, full: bool
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        audit.verify(host.app())  # checkpoint
        _cycle(host, 2)
        (step_id,) = raw_rows(host, "SELECT max(id) FROM step_events WHERE detail_json <> '{}'")[0]
        entry = [
            int(str(e["id"]))
            for e in _journal(host)
            if ["step_events", step_id] in [r[:2] for r in json.loads(str(e["rows_json"]))]
        ]
        report = verify_after_edit(
            host,
            "step_events_no_update",
            "UPDATE step_events SET detail_json = '{\"forged\":1}' WHERE id = ?",
            (step_id,),
            full=full,
        )
        assert [(p["row_id"], p.get("table"), p.get("key"), p["problem"]) for p in report["problems"]] == [
            (entry[0], "step_events", step_id, EDITED)
        ]


class TestCompactTimeAndTransaction:
    SQLITE = sqlite_dialect()

    @pytest.mark.parametrize(
        ("column", "value", "size"),
        [
            (coltypes.CompactTime(), "2026-12-01T02:38:40.324711Z", 8),
            (coltypes.CompactTime(), "1970-01-01T00:00:00.000000Z", 8),
            (coltypes.CompactUuid(), "ebb3b74e-e315-4139-8efd-665926a40560", 16),
        ],
    )
    def test_a_value_in_its_form_is_stored_as_bytes_and_reads_back_the_same(
        self, column: coltypes.CompactTime | coltypes.CompactUuid, value: str, size: int
    ) -> None:
        stored = column.process_bind_param(value, self.SQLITE)
        assert isinstance(stored, bytes) and len(stored) == size
        assert column.process_result_value(stored, self.SQLITE) == value

    @pytest.mark.parametrize(
        ("column", "value"),
        [
            (coltypes.CompactTime(), "2026-12-01T02:38:40Z"),
            (coltypes.CompactTime(), "2026-12-01 02:38:40.324711"),
            (coltypes.CompactTime(), "1969-12-31T23:59:59.000000Z"),
            (coltypes.CompactUuid(), "EBB3B74E-E315-4139-8EFD-665926A40560"),
            (coltypes.CompactUuid(), "tx-old"),
            (coltypes.CompactUuid(), "ebb3b74ee3154139-8efd-665926a40560{}"),
        ],
    )
    def test_a_value_that_would_not_read_back_the_same_stays_text(
        self, column: coltypes.CompactTime | coltypes.CompactUuid, value: str
    ) -> None:
        assert column.process_bind_param(value, self.SQLITE) == value

    def test_entries_with_text_and_compact_values_verify_together(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
            return value

        with monkeypatch.context() as m:  # as anvilctl wrote before 0011
            m.setattr(coltypes.CompactTime, "process_bind_param", as_text)
            m.setattr(coltypes.CompactUuid, "process_bind_param", as_text)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        _cycle(host, 2)
        forms = set(raw_rows(host, "SELECT typeof(at), typeof(tx_id) FROM audit_journal"))
        assert {("text", "text"), ("blob", "blob"), ("blob", "null")} <= forms
        assert raw_rows(host, "SELECT DISTINCT length(at) FROM audit_journal WHERE typeof(at) = 'blob'") == [
            (8,)
        ]
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and incremental["entries"] > 0
        assert audit.verify(host.app(), full=True)["ok"]

    @pytest.mark.parametrize(
        ("column", "value"), [("at", (1).to_bytes(8, "big")), ("at", b"\x01"), ("tx_id", bytes(16))]
    )
    def test_a_compact_value_rewritten_is_named(self, tmp_path: Path, column: str, value: bytes) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        (n,) = raw_rows(host, "SELECT max(id) FROM audit_journal WHERE typeof(tx_id) = 'blob'")[0]
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        triggers = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_journal'"
        ).fetchall()
        for name, _ddl in triggers:
            con.execute(f"DROP TRIGGER {name}")
        con.execute(f"UPDATE audit_journal SET {column} = ? WHERE id = ?", (value, n))
        for _name, ddl in triggers:
            con.execute(ddl)
        con.commit()
        con.close()
        report = audit.verify(host.app(), full=True)
        assert not report["ok"]
        assert [(p["row_id"], p["problem"]) for p in report["problems"]] == [
            (n, "content edited: hash does not match the entry")
        ]


class TestBatchEntries:
    def test_events_named_by_their_own_rows_are_left_out_the_others_kept(self) -> None:
        held: list[audit_chain.Held] = [
            ("step.do.result", "tx-1", {}, 1),
            ("gpu.claim", "tx-1", {}, 1),  # no row of its own: no role was claimed
            ("tx.committed", "tx-1", {"from": "running"}, 2),
            ("snapshot", "tx-1", {}, 4),
        ]
        assert audit_chain.batch_entry(held) == (
            "batch",
            "tx-1",
            {"events": ["gpu.claim", {"event": "tx.committed", "from": "running"}]},
        )
        rows_only = [("step.do.result", "tx-1", {}, 1), ("step.do.intent", "tx-1", {}, 2)]
        assert audit_chain.batch_entry(rows_only) == ("batch", "tx-1", {})
        alone = [("step.do.intent", "tx-1", {}, 1)]
        assert audit_chain.batch_entry(alone) == ("step.do.intent", "tx-1", {})

    def test_events_of_several_transactions_keep_each_its_transaction(self) -> None:
        held: list[audit_chain.Held] = [("step.do.result", "tx-1", {}, 1), ("lock.released", None, {}, 2)]
        assert audit_chain.batch_entry(held) == (
            "batch",
            None,
            {
                "events": [
                    {"event": "step.do.result", "tx_id": "tx-1"},
                    {"event": "lock.released", "tx_id": None},
                ]
            },
        )

    def test_a_cycle_s_batches_cover_their_rows_and_verify(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        con.row_factory = JournalRow
        try:
            batches = con.execute(
                "SELECT payload_json, rows_json FROM audit_journal WHERE event = 'batch'"
            ).fetchall()
        finally:
            con.close()
        empty = [json.loads(str(b["rows_json"])) for b in batches if b["payload_json"] == "{}"]
        assert empty and all(len(rows) >= 2 for rows in empty)  # the rows name what the batch held
        assert {r[0] for rows in empty for r in rows} >= {"step_events"}
        assert audit.verify(host.app(), full=True)["ok"]


def _blobs(host: FakeHost) -> dict[str, str]:
    """Every blob's text as stored (whole or a delta), by SHA-256."""
    with host.app().store.read() as s:
        return {sha: text for sha in _shas(host) if (text := snapshots._stored(s, sha)) is not None}


def _shas(host: FakeHost) -> list[str]:
    return [str(sha) for (sha,) in raw_rows(host, "SELECT sha256 FROM snapshot_blobs ORDER BY rowid")]


class TestSnapshotDeltas:
    BASE = json.dumps({"schema": 1, "slots": {"primary": {"containers": {"a" * 64: {"status": "running"}}}}})

    def test_a_delta_inflates_back_and_one_no_smaller_is_not_made(self) -> None:
        text = self.BASE.replace("running", "exited")
        delta = blobdelta.encode(text, "b" * 64, self.BASE)
        assert delta is not None and blobdelta.base_of(delta) == "b" * 64
        assert blobdelta.decode(delta, lambda sha: self.BASE if sha == "b" * 64 else "") == text
        unrelated = json.dumps({"schema": 1, "noise": [str(n) * 7 for n in range(300)]})
        assert blobdelta.encode(unrelated, "b" * 64, "x") is None
        assert (
            blobdelta.base_of(self.BASE) is None and blobdelta.decode(self.BASE, lambda _s: "") == self.BASE
        )
        with pytest.raises(ValueError, match="does not inflate"):
            blobdelta.decode(delta, lambda _sha: self.BASE.replace("a", "c"))

    def test_a_cycle_stores_deltas_and_every_blob_reads_as_the_body_its_sha256_names(
        self, tmp_path: Path
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        _cycle(host, 2)
        stored = _blobs(host)
        deltas = {sha: blobdelta.base_of(t) for sha, t in stored.items() if blobdelta.base_of(t)}
        assert deltas and all(
            base in stored and blobdelta.base_of(stored[base]) is None for base in deltas.values()
        )
        with host.app().store.read() as s:
            for sha in stored:
                assert Snapshot(json.loads(snapshots._blob(s, sha))).sha256 == sha
        assert audit.verify(host.app(), full=True)["ok"]

    def test_whole_blobs_written_before_read_with_deltas(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:  # as anvilctl wrote before 0011: every body whole
            m.setattr(blobdelta, "encode", lambda *_a: None)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
        whole = set(_shas(host))
        _cycle(host, 2)
        stored = _blobs(host)
        assert all(blobdelta.base_of(stored[sha]) is None for sha in whole)
        assert any(blobdelta.base_of(t) for sha, t in stored.items() if sha not in whole)
        with host.app().store.read() as s:
            assert all(Snapshot(json.loads(snapshots._blob(s, sha))).sha256 == sha for sha in stored)
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["rows"] > 0

    def test_a_delta_s_base_rewritten_is_named_and_the_delta_refuses_to_read(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        stored = _blobs(host)
        sha, base = next((sha, b) for sha, t in stored.items() if (b := blobdelta.base_of(t)))
        report = verify_after_edit(
            host,
            "snapshot_blobs_no_update",
            "UPDATE snapshot_blobs SET body_json = ? WHERE sha256 = ?",
            (stored[base] + " ", base),
        )
        assert [(p.get("table"), p.get("key")) for p in report["problems"]] == [("snapshot_blobs", base)]
        with host.app().store.read() as s, pytest.raises(StateStoreError, match="does not inflate"):
            snapshots._blob(s, sha)


def _the_0010_way(m: pytest.MonkeyPatch) -> None:
    """Write as anvilctl at 0010 did: 32-byte digests, text times and IDs, whole blobs and diffs."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(audit_chain, "ROW_DIGEST_BYTES", 32)
    m.setattr(coltypes.CompactTime, "process_bind_param", as_text)
    m.setattr(coltypes.CompactUuid, "process_bind_param", as_text)
    m.setattr(blobdelta, "encode", lambda *_a: None)
    m.setattr(snapshots, "_derivable", lambda *_a: False)


def _snapshot_indexes(host: FakeHost) -> set[str]:
    return {
        str(n)
        for (n,) in raw_rows(
            host, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'snapshots'"
        )
    }


class TestUpgradeTo0011:
    def test_rows_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0010_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among 0010 rows
        assert _digest_lengths(host) == {43}
        assert "ix_snapshots_sha256" not in _snapshot_indexes(host)
        engine = make_engine(f"sqlite:///{host.settings.state_dir / 'anvil.db'}")
        command.downgrade(alembic_config(engine), "0010")
        assert "ix_snapshots_sha256" in _snapshot_indexes(host)
        command.upgrade(alembic_config(engine), "head")
        assert "ix_snapshots_sha256" not in _snapshot_indexes(host)
        first = audit.verify(host.app())  # from the checkpoint: the schema changed since
        assert first["ok"] and first["escalated"] and "schema changed" in first["escalated"]

        _cycle(host, 2)
        assert _digest_lengths(host) == {43, 22}
        assert {("text",), ("blob",)} <= set(raw_rows(host, "SELECT DISTINCT typeof(at) FROM audit_journal"))
        assert any(blobdelta.base_of(t) for t in _blobs(host).values())
        assert (
            raw_rows(host, "SELECT count(*) FROM snapshot_diffs WHERE changes_json = ?", snapshots.DERIVED)[
                0
            ][0]
            > 0
        )
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and not incremental["escalated"]
        full = audit.verify(host.app(), full=True)
        assert full["ok"] and not full["projection_differs"]

        before = raw_rows(host, "SELECT count(*) FROM audit_journal")
        command.downgrade(alembic_config(engine), "0010")  # the new rows stay
        assert raw_rows(host, "SELECT count(*) FROM audit_journal") == before
        assert "ix_snapshots_sha256" in _snapshot_indexes(host)
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.app(), full=True)["ok"]
