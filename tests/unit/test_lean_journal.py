"""Lean audit entries: a tag of the previous hash, the hash as bytes, the covered rows packed,
and no payload that repeats the rows an entry covers.

- `rowrefs` packs a `rows_json` list so that it reads back as the same text, or leaves it
  text when it would not.
- Entries written the old way (the whole previous hash, hex text, text rows: what
  0007/0008-era anvilctl wrote) and lean ones verify together, incrementally from a
  checkpoint recorded among the old ones and in full.
- A lean entry edited, its link or its packed rows rewritten, or deleted is named.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from anvil_ctl.commands import audit
from anvil_ctl.core.model import Identity, canonical_json
from anvil_ctl.persistence import audit as audit_chain
from anvil_ctl.persistence import coltypes, identities, projection, rowrefs
from anvil_ctl.persistence.coltypes import LinkTag
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from anvil_ctl.persistence.models import IdentityRow
from anvil_ctl.persistence.rowrefs import TAG, Unpackable, pack_rows, unpack_rows
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import raw_rows
from tests.unit.rawjournal import JournalRow
from tests.unit.test_lean_records import _cycle

DIGEST = "0guvJ3yr4TApTTvm4pA6WTSktdgSk2WWrrBnml4yDuU"


def _tag(stored: object) -> str:
    """A stored `prev_hash` as its hex digits (a lean entry's 8 are 4 bytes from 0018 on)."""
    return str(_LINK.process_result_value(stored, sqlite_dialect()))


_LINK = LinkTag()


def _attack(host: FakeHost, sql: str, *args: object) -> None:
    """Past the journal's append-only triggers (dropped, the statement run, put back)."""
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    try:
        triggers = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_journal'"
        ).fetchall()
        for name, _ddl in triggers:
            con.execute(f"DROP TRIGGER {name}")
        con.execute(sql, args)
        for _name, ddl in triggers:
            con.execute(ddl)
        con.commit()
    finally:
        con.close()


def _old_writer(m: pytest.MonkeyPatch) -> None:
    """Write entries as anvilctl did before 0010: whole previous hash, hex hash, text rows."""
    m.setattr(audit_chain, "LINK_TAG", 64)

    def unpackable(text: str) -> bytes:
        raise Unpackable(text)

    def as_text(self: coltypes.HexDigest, value: str | None, dialect: Dialect) -> str | None:
        return value

    m.setattr(rowrefs, "pack_rows", unpackable)
    m.setattr(coltypes.HexDigest, "process_bind_param", as_text)


class TestPackedRows:
    @pytest.mark.parametrize(
        "key",
        [
            7,
            300,
            2**40,
            "3f0c6c7e-8d0a-4a55-9f5e-0c1d2e3f4a5b",
            "ab" * 32,
            "dec-1",
            "w-ü",
            "A" * 36,
            "AB" * 32,
        ],
    )
    def test_every_kind_of_key_reads_back_as_the_same_text(self, key: str | int) -> None:
        text = json.dumps([["decisions", key, DIGEST], ["step_events", 1, DIGEST]], separators=(",", ":"))
        text = audit_chain.canonical_json(json.loads(text))
        packed = pack_rows(text)
        assert packed.startswith(TAG) and unpack_rows(packed) == text
        assert len(packed) < len(text.encode())

    @pytest.mark.parametrize(
        "text",
        [
            '[["step_events",1,"' + "ab" * 32 + '"]]',  # a hex digest (entries before base64url)
            '[["not_history",1,"' + DIGEST + '"]]',
            '[["step_events",-1,"' + DIGEST + '"]]',
            "[]",
            "{}",
            "not json",
        ],
    )
    def test_what_would_not_read_back_the_same_stays_text(self, text: str) -> None:
        with pytest.raises(Unpackable):
            pack_rows(text)

    def test_a_blob_that_is_not_a_packed_list_is_refused(self) -> None:
        for blob in (b"[]", TAG + b"\x08\x01", TAG + bytes([255])):
            with pytest.raises(ValueError, match="not a packed row list"):
                unpack_rows(blob)


class TestLeanEntries:
    def test_new_entries_are_lean_at_rest(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        rows = raw_rows(
            host, "SELECT prev_hash, typeof(hash), length(hash), typeof(rows_json) FROM audit_journal"
        )
        assert {(len(_tag(p)), t, n) for p, t, n, _r in rows} == {(8, "blob", 32)}
        assert {r for *_x, r in rows} == {"blob"}  # every entry of a cycle covers rows
        payloads = [str(p) for (p,) in raw_rows(host, "SELECT payload_json FROM audit_journal")]
        # what the step, snapshot and identity rows hold is not repeated in the entries
        assert payloads and not [p for p in payloads if '"seq"' in p or '"sha256"' in p or '"digest"' in p]

    def test_a_batch_names_its_events_and_keeps_only_payloads_its_rows_do_not_hold(
        self, tmp_path: Path
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        batches = [
            json.loads(str(p))
            for (p,) in raw_rows(host, "SELECT payload_json FROM audit_journal WHERE event = 'batch'")
        ]
        events = [e for b in batches for e in b.get("events", [])]
        # from 0011 an event whose own rows name it is left out (test_lean_bytes)
        assert {} in batches and "step.do.result" not in events and "step.do.intent" not in events
        assert {"event": "tx.committed", "from": "running"} in events

    def test_old_and_lean_entries_verify_together_from_an_old_checkpoint_and_in_full(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _old_writer(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            old = audit.verify(host.app(), full=True)  # records a checkpoint among old entries
        assert old["ok"]
        assert {
            (len(_tag(p)), t) for p, t in raw_rows(host, "SELECT prev_hash, typeof(hash) FROM audit_journal")
        } == {(64, "text")}
        _cycle(host, 2)
        forms = {
            (len(_tag(p)), t) for p, t in raw_rows(host, "SELECT prev_hash, typeof(hash) FROM audit_journal")
        }
        assert forms == {(64, "text"), (8, "blob")}
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and not incremental["escalated"]
        assert incremental["entries"] > 0 and incremental["rows"] > 0
        full = audit.verify(host.app(), full=True)
        assert full["ok"] and full["entries"] > incremental["entries"]


class TestALeanEntryRewritten:
    @pytest.fixture
    def host(self, tmp_path: Path) -> FakeHost:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        return host

    def _problems(self, host: FakeHost) -> list[tuple[int | None, str]]:
        report = audit.verify(host.app(), full=True)
        assert not report["ok"]
        return [(p["row_id"], p["problem"]) for p in report["problems"]]

    def _middle_entry_with_rows(self, host: FakeHost) -> int:
        ids = [i for (i,) in raw_rows(host, "SELECT id FROM audit_journal WHERE typeof(rows_json) = 'blob'")]
        return int(str(ids[len(ids) // 2]))

    def test_an_edited_payload_is_named(self, host: FakeHost) -> None:
        n = self._middle_entry_with_rows(host)
        _attack(host, "UPDATE audit_journal SET payload_json = '{\"x\":1}' WHERE id = ?", n)
        assert (n, "content edited: hash does not match the entry") in self._problems(host)

    def test_a_digest_changed_inside_the_packed_rows_is_named(self, host: FakeHost) -> None:
        n = self._middle_entry_with_rows(host)
        (blob,) = raw_rows(host, "SELECT rows_json FROM audit_journal WHERE id = ?", n)[0]
        assert isinstance(blob, bytes)
        forged = blob[:-1] + bytes([blob[-1] ^ 1])
        _attack(host, "UPDATE audit_journal SET rows_json = ? WHERE id = ?", forged, n)
        problems = self._problems(host)
        assert (n, "content edited: hash does not match the entry") in problems
        assert any(p.startswith("content edited: row digest") for _n, p in problems)

    def test_rows_that_are_not_a_packed_list_are_named(self, host: FakeHost) -> None:
        n = self._middle_entry_with_rows(host)
        _attack(host, "UPDATE audit_journal SET rows_json = ? WHERE id = ?", TAG + b"\xff", n)
        problems = self._problems(host)
        assert (n, "content edited: hash does not match the entry") in problems
        assert (n, "rows_json is not a list of [table, key, digest]") in problems

    def test_an_edited_link_is_named(self, host: FakeHost) -> None:
        n = self._middle_entry_with_rows(host)
        _attack(host, "UPDATE audit_journal SET prev_hash = 'deadbeef' WHERE id = ?", n)
        assert (
            n,
            "link broken: prev_hash does not match the entry before it (an entry was deleted, "
            "inserted or reordered)",
        ) in self._problems(host)

    def test_a_deleted_entry_is_named_at_the_next(self, host: FakeHost) -> None:
        n = self._middle_entry_with_rows(host)
        _attack(host, "DELETE FROM audit_journal WHERE id = ?", n)
        problems = self._problems(host)
        assert (n + 1, f"entries {n}..{n} missing (deleted)") in problems
        assert any(i == n + 1 and p.startswith("link broken") for i, p in problems)
        assert any(p.startswith("row deleted") or p.startswith("row not covered") for _i, p in problems)

    def test_the_raw_journal_reads_as_what_was_hashed(self, host: FakeHost) -> None:
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        con.row_factory = JournalRow
        try:
            rows = con.execute("SELECT * FROM audit_journal ORDER BY id").fetchall()
        finally:
            con.close()
        prev = audit_chain.GENESIS
        for e in rows:
            assert e["prev_hash"] == prev[:8]
            assert e["hash"] == audit_chain.entry_hash(
                prev,
                int(str(e["id"])),
                at=str(e["at"]),
                tx_id=e["tx_id"] and str(e["tx_id"]),
                event=str(e["event"]),
                payload=str(e["payload_json"]),
                rows=str(e["rows_json"]),
                host=None if e["host_id"] is None else int(str(e["host_id"])),
            )
            prev = str(e["hash"])


def _old_identities(m: pytest.MonkeyPatch) -> None:
    """Record identities as anvilctl did before 0010: the body in each row."""

    def record(s: Session, tx_id: str | None, role: str, identity: Identity, now: str) -> int:
        row = IdentityRow(
            tx_id=tx_id,
            slot=identity.slot,
            role=role,
            digest=identity.digest,
            container_id=identity.container_id,
            image_id=identity.image_id,
            served_model=identity.served_model,
            body_json=canonical_json(identity.as_dict()),
            at=now,
        )
        s.add(row)
        s.flush()
        projection.on_identity(s, row)
        return row.id

    m.setattr(identities, "record", record)


class TestUpgradeTo0010:
    """A database written before 0010 (old entries, identity bodies in their rows, a
    checkpoint among them) at revision 0008, upgraded, then written to by this code."""

    def test_it_upgrades_and_verifies_from_the_old_checkpoint_and_in_full(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _old_writer(m)
            _old_identities(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]
        db = host.settings.state_dir / "anvil.db"
        engine = make_engine(f"sqlite:///{db}")
        command.downgrade(alembic_config(engine), "0008")
        assert raw_rows(host, "SELECT count(*) FROM identity_bodies") == [(0,)]
        indexes = {
            str(n)
            for (n,) in raw_rows(host, "SELECT name FROM sqlite_master WHERE tbl_name = 'audit_journal'")
        }
        assert "ix_audit_journal_tx_id" in indexes and "sqlite_autoindex_audit_journal_1" in indexes
        before = raw_rows(host, "SELECT id, prev_hash, hash, rows_json FROM audit_journal ORDER BY id")

        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert (
            raw_rows(host, "SELECT id, prev_hash, hash, rows_json FROM audit_journal ORDER BY id") == before
        )
        indexes = {
            str(n)
            for (n,) in raw_rows(host, "SELECT name FROM sqlite_master WHERE tbl_name = 'audit_journal'")
        }
        assert indexes == {
            "audit_journal",
            "audit_journal_no_update",
            "audit_journal_no_delete",
            "audit_journal_no_replace",
        }
        first = audit.verify(host.app())  # from the old checkpoint: the schema changed since
        assert first["ok"] and first["escalated"] and "schema changed" in first["escalated"]

        _cycle(host, 2)
        assert raw_rows(host, "SELECT count(*) FROM identities WHERE body_json = ''")[0][0] > 0
        assert raw_rows(host, "SELECT count(*) FROM identities WHERE body_json <> ''")[0][0] > 0
        assert raw_rows(host, "SELECT count(*) FROM v_serving_history WHERE identity_json IS NULL") == [(0,)]
        app = host.app()
        incumbent = app.store.current_identity("primary", "incumbent")
        assert incumbent is not None and incumbent.container_id == host.incumbent_id
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental" and not incremental["escalated"]
        full = audit.verify(host.app(), full=True)
        assert full["ok"] and not full["projection_differs"]
        forms = {
            (len(_tag(p)), t) for p, t in raw_rows(host, "SELECT prev_hash, typeof(hash) FROM audit_journal")
        }
        assert forms == {(64, "text"), (8, "blob")}

    def test_a_replayed_entry_is_refused_by_id_after_the_upgrade(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        try:
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                con.execute("INSERT OR REPLACE INTO audit_journal SELECT * FROM audit_journal WHERE id = 1")
        finally:
            con.close()
