"""Compact identities (issue 13, bytes per transaction): migration 0017.

- On SQLite an identity row's `digest` and `container_id` are stored as their 32 bytes and
  its `image_id` as `sha256:`'s 32 bytes, read back by the Store as the text its row digest
  covers; `v_identities` and `v_serving_history` (the README's queries) show that text and
  still find an identity's body; the projection rebuilt from them matches.
- Values that would not read back the same stay text; a compact container ID edited past
  the trigger is named; shell completion finds containers by prefix in both forms.
- Rows written before (text) and after verify together, in full and from a checkpoint,
  across a downgrade to 0016 (whose views show the stored value) and an upgrade; the
  downgrade keeps every row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from anvil_ctl.commands import audit
from anvil_ctl.persistence import coltypes, queries
from anvil_ctl.persistence.coltypes import HexDigest, ImageId
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, named, raw_rows, verify_after_edit
from tests.unit.test_lean_records import _cycle

SLOT = "primary"
SHOWN = "SELECT id, container_id, image_id, digest FROM v_identities ORDER BY id"
SQLITE = sqlite_dialect()


def _forms(host: FakeHost) -> set[tuple[object, ...]]:
    return set(
        raw_rows(host, "SELECT typeof(digest), typeof(container_id), typeof(image_id) FROM identities")
    )


def _the_0016_way(m: pytest.MonkeyPatch) -> None:
    """Write identities as anvilctl at 0016 did: text (and with them the other 32-byte IDs, as
    anvilctl did before 0011 and 0014: those forms verify alike)."""

    def as_text(_self: object, value: str | None, _dialect: object) -> str | None:
        return value

    m.setattr(HexDigest, "process_bind_param", as_text)
    m.setattr(ImageId, "process_bind_param", as_text)


class TestImageId:
    @pytest.mark.parametrize(
        "value",
        [
            "sha256:" + "0c" * 32,
            "sha256:" + "0C" * 32,  # not lowercase: would not read back the same
            "0c" * 32,
            "sha256:short",
            "sha512:" + "0c" * 32,
        ],
    )
    def test_an_image_id_reads_back_as_it_was_given(self, value: str) -> None:
        kind = ImageId()
        stored = kind.process_bind_param(value, SQLITE)
        compact = value == "sha256:" + "0c" * 32
        assert isinstance(stored, bytes) == compact and (not compact or len(stored) == 32)
        assert kind.process_result_value(stored, SQLITE) == value


class TestCompactIdentities:
    def test_ids_are_bytes_at_rest_and_read_back_as_text_by_store_views_and_projection(
        self, tmp_path: Path
    ) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert _forms(host) == {("blob", "blob", "blob")}
        app = host.app()
        incumbent = app.store.current_identity(SLOT, "incumbent")
        assert incumbent is not None
        ((cid, image, digest),) = raw_rows(
            host,
            "SELECT container_id, image_id, digest FROM v_identities"
            " WHERE slot = ? AND role = 'incumbent' ORDER BY id DESC LIMIT 1",
            SLOT,
        )
        assert (cid, image) == (incumbent.container_id, incumbent.image_id)
        assert isinstance(digest, str) and len(digest) == 64 and image.startswith("sha256:")  # type: ignore[union-attr]
        served = raw_rows(host, "SELECT container_id, image_id, digest, identity_json FROM v_serving_history")
        assert served and all(isinstance(v, str) for row in served for v in row)  # bodies found
        raw = raw_rows(host, "SELECT container_id FROM identities ORDER BY id DESC LIMIT 1")[0][0]
        assert (
            isinstance(raw, bytes)
            and coltypes.digest_of(raw)
            == raw_rows(host, "SELECT container_id FROM v_identities ORDER BY id DESC LIMIT 1")[0][0]
        )
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []
        found = queries.recent_ids(app.store, "container", str(cid)[:10])
        assert [c for c, _what in found] == [cid]

    def test_a_compact_container_id_edited_afterwards_is_named(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        _cycle(host, 1)
        assert audit.verify(host.app(), full=True)["ok"]
        row_id, raw = raw_rows(host, "SELECT id, container_id FROM identities ORDER BY id DESC LIMIT 1")[0]
        assert isinstance(raw, bytes) and len(raw) == 32
        report = verify_after_edit(
            host,
            "identities_no_update",
            "UPDATE identities SET container_id = ? WHERE id = ?",
            (bytes(32), row_id),
        )
        assert named(report) == [("identities", row_id, EDITED)]


class TestUpgradeTo0017:
    def test_identities_of_both_forms_verify_across_a_downgrade_and_upgrade(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as m:
            _the_0016_way(m)
            host = make_fake_host(tmp_path)
            _cycle(host, 1)
            assert audit.verify(host.app(), full=True)["ok"]  # the checkpoint, among text rows
        assert _forms(host) == {("text", "text", "text")}
        text_rows = raw_rows(host, SHOWN)
        engine = make_engine(f"sqlite:///{db_file(host)}")
        command.downgrade(alembic_config(engine), "0016")
        assert raw_rows(host, "SELECT version_num FROM alembic_version") == [("0016",)]
        command.upgrade(alembic_config(engine), "head")

        _cycle(host, 2)
        assert _forms(host) == {("text", "text", "text"), ("blob", "blob", "blob")}
        shown = raw_rows(host, SHOWN)
        assert shown[: len(text_rows)] == text_rows  # the older rows read as they did
        assert all(isinstance(v, str) for row in shown for v in row[1:])
        incremental = audit.verify(host.app())
        assert incremental["ok"] and incremental["mode"] == "incremental"
        report = audit.verify(host.app(), full=True)
        assert report["ok"] and report["projection_differs"] == []

        stored = "SELECT * FROM identities ORDER BY id"
        before = raw_rows(host, stored)
        command.downgrade(alembic_config(engine), "0016")  # the compact rows stay
        assert raw_rows(host, stored) == before
        assert {type(c) for (_i, c, _m, _d) in raw_rows(host, SHOWN)} == {str, bytes}  # 0016's views
        command.upgrade(alembic_config(engine), "head")
        engine.dispose()
        assert raw_rows(host, SHOWN) == shown
        assert audit.verify(host.app(), full=True)["ok"]
