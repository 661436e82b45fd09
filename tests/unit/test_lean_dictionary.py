"""Dictionary packing (issue 13, bytes per transaction): migration 0015.

- On SQLite a JSON body of 16 bytes or more (a step's detail, a transaction's arguments,
  a snapshot body, a diff) is stored, when smaller, as raw deflate against the preset
  dictionary `jsondict.JSON_V1` behind the tag `00 79`, and read back as the text its row
  digest covers; `{}` stays text. The dictionary is pinned: a value packed with it inflates
  against those bytes only.
- Bodies packed the 0014 way (`00 7a`, a zlib stream) and the 0015 way read back and
  verify together, in full and from a checkpoint, across a downgrade to 0014 and an
  upgrade; a downgrade keeps every row as it was stored.
- A `00 79` body edited past the trigger is named by table and key; a BLOB under the
  tag that is not a whole deflate stream is refused, not misread.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import pytest
from alembic import command

from anvil_ctl.commands import audit
from anvil_ctl.persistence import coltypes
from anvil_ctl.persistence.coltypes import PACKED, PACKED_DICT, is_packed, pack, unpack
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.jsondict import JSON_V1
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, named, raw_rows, verify_after_edit
from tests.unit.test_lean_history import TX_OF
from tests.unit.test_lean_records import _cycle

PACKED_COLUMNS = (
    ("step_events", "detail_json"),
    ("transactions", "args_json"),
    ("snapshot_blobs", "body_json"),
)


def _tags(host: FakeHost, table: str, column: str) -> set[bytes]:
    return {bytes(v[:2]) for (v,) in raw_rows(host, f"SELECT {column} FROM {table}") if isinstance(v, bytes)}


def _the_0014_way(m: pytest.MonkeyPatch) -> None:
    """Pack as anvilctl at 0014 did: a zlib stream tagged `00 7a`, for 128 bytes or more."""

    def pack_0014(text: str) -> str | bytes:
        raw = text.encode()
        if len(raw) < 128:
            return text
        packed = PACKED + zlib.compress(raw, 9)
        return packed if len(packed) < len(raw) else text

    m.setattr(coltypes, "pack", pack_0014)


class TestDictionary:
    def test_the_dictionary_is_pinned(self) -> None:
        # every `00 79` value ever stored inflates against exactly these bytes
        assert len(JSON_V1) == 5482
        assert hashlib.sha256(JSON_V1).hexdigest() == (
            "172a6d0afce804bb29674ceb263af2a532979c53dbd5fd830ed9ce4e568be726"
        )

    def test_a_body_packs_against_it_smaller_than_a_zlib_stream_and_reads_back(self) -> None:
        text = json.dumps(
            {"container_id": "ab" * 32, "first_poll": {"healthy": True, "listening": True}},
            sort_keys=True,
            separators=(",", ":"),
        )
        packed = pack(text)
        assert isinstance(packed, bytes) and packed.startswith(PACKED_DICT) and is_packed(packed)
        assert len(packed) < len(PACKED + zlib.compress(text.encode(), 9))
        assert unpack(packed) == text

    def test_a_zlib_stream_of_before_reads_back(self) -> None:
        text = '{"tier":"primary-local","x":"' + "y" * 200 + '"}'
        old = PACKED + zlib.compress(text.encode(), 9)
        assert is_packed(old) and unpack(old) == text

    def test_short_bodies_stay_text(self) -> None:
        assert pack("{}") == "{}"
        assert pack('{"a":1}') == '{"a":1}'

    @pytest.mark.parametrize(
        "stored",
        [
            PACKED_DICT + b"\xff\xff\xff",  # not deflate
            PACKED_DICT + zlib.compressobj(9, zlib.DEFLATED, -15, 9, zdict=JSON_V1).flush()[:-1],
        ],
    )
    def test_a_blob_under_the_tag_that_is_not_one_whole_stream_is_refused(self, stored: bytes) -> None:
        with pytest.raises(zlib.error):
            unpack(stored)


class TestDictionaryPackingAtRest:
    def test_bodies_are_dictionary_packed_and_read_back_as_the_same_records(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        for table, column in PACKED_COLUMNS:
            assert _tags(host, table, column) == {PACKED_DICT}, (table, column)
        # small details now pack too (128 bytes was 0014's floor); `{}` stays text
        sizes = raw_rows(
            host,
            "SELECT length(CAST(detail_json AS BLOB)) FROM step_events WHERE typeof(detail_json) = 'blob'",
        )
        assert any(int(str(n)) < 64 for (n,) in sizes)
        assert raw_rows(
            host, "SELECT DISTINCT detail_json FROM step_events WHERE typeof(detail_json) = 'text'"
        ) == [("{}",)]
        ((tx_id,),) = raw_rows(host, "SELECT id FROM transactions WHERE kind = 'rollback'")
        app = host.app()
        for (raw,) in raw_rows(host, f"SELECT detail_json FROM step_events WHERE {TX_OF} = ?", tx_id):
            if isinstance(raw, bytes):
                assert raw.startswith(PACKED_DICT)
        details = [e.detail for e in app.store.step_events(str(tx_id))]
        stored = [
            json.loads(unpack(raw) if isinstance(raw, bytes) else str(raw))
            for (raw,) in raw_rows(
                host, f"SELECT detail_json FROM step_events WHERE {TX_OF} = ? ORDER BY id", tx_id
            )
        ]
        assert details == stored
        assert audit.verify(host.app(), full=True)["ok"]

    def test_a_dictionary_packed_detail_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(
            host,
            "SELECT id, detail_json FROM step_events"
            " WHERE step = 'release-vram' AND event = 'result' LIMIT 1",
        )[0]
        assert isinstance(raw, bytes) and raw.startswith(PACKED_DICT)
        forged = pack(unpack(raw).replace('"released":true', '"released":false'))
        assert isinstance(forged, bytes) and unpack(forged) != unpack(raw)
        report = verify_after_edit(
            host,
            "step_events_no_update",
            "UPDATE step_events SET detail_json = ? WHERE id = ?",
            (forged, row_id),
        )
        assert named(report) == [("step_events", row_id, EDITED)]


class TestUpgradeTo0015:
    def test_bodies_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0014_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among 0014 rows
        for table, column in PACKED_COLUMNS:
            assert _tags(host, table, column) == {PACKED}, (table, column)
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0014")
        assert raw_rows(host, "SELECT version_num FROM alembic_version") == [("0014",)]
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        for table, column in PACKED_COLUMNS:
            assert _tags(host, table, column) == {PACKED, PACKED_DICT}, (table, column)
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        assert audit.verify(host.app(), full=True)["ok"]
        # the Store reads the older transaction's steps as written
        first = str(
            raw_rows(host, "SELECT id FROM transactions WHERE kind = 'load' ORDER BY created_at")[0][0]
        )
        assert [e.step for e in host.app().store.step_events(first)]

        stored = "SELECT id, detail_json FROM step_events ORDER BY id"
        before = raw_rows(host, stored)
        command.downgrade(alembic_config(engine), "0014")  # every row stays as stored
        assert raw_rows(host, stored) == before
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert audit.verify(host.app(), full=True)["ok"]
