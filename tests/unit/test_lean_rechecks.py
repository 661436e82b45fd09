"""A recheck run's assertions are packed at rest on SQLite (migration 0020), as step details are.

cron rechecks every 15 minutes (README), and a run's assertions (what each observed) were most
of its bytes, as plain text: ~2.3 KB a run. Packed they are read back as the same text, a row's
digest is over that text, so rows written before (text) and after (packed) verify alike, and a
packed row edited afterwards is named by `audit verify`.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from anvil_ctl.commands import audit
from anvil_ctl.commands.recheck import recheck
from anvil_ctl.persistence import coltypes
from anvil_ctl.persistence.coltypes import pack, unpack
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import EDITED, db_file, verify_after_edit

SLOT = "primary"


def _stored(host: FakeHost) -> list[tuple[int, str, bytes | str]]:
    """(id, storage type, value) of every run's assertions, as SQLite holds them."""
    with sqlite3.connect(db_file(host)) as con:
        rows = con.execute("SELECT id, typeof(assertions_json), assertions_json FROM rechecks ORDER BY id")
        return [(int(i), str(t), v) for i, t, v in rows]


def _run(host: FakeHost) -> int:
    out = recheck(host.app(), SLOT)
    assert out.passed and out.recheck_id is not None, out.failed
    return out.recheck_id


def test_a_runs_assertions_are_packed_smaller_and_read_back_as_the_text_it_recorded(tmp_path: Path) -> None:
    host = make_fake_host(tmp_path)
    _run(host)
    [(_, kind, raw)] = _stored(host)
    assert kind == "blob" and isinstance(raw, bytes)
    text = unpack(raw)
    assertions = json.loads(text)
    assert {a["name"] for a in assertions} >= {"incumbent_container_running", "routed_smoke", "gpu_owner"}
    assert len(raw) * 3 < len(text.encode()), (len(raw), len(text))  # 1,722 -> 457 bytes here
    assert audit.verify(host.app(), full=True)["ok"]


def test_runs_written_as_text_before_and_packed_after_verify_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = make_fake_host(tmp_path)
    with monkeypatch.context() as m:  # what anvilctl before 0020 wrote: the text
        m.setattr(coltypes, "MIN_PACKED", 10**9)
        old = _run(host)
    new = _run(host)
    kinds = {i: k for i, k, _ in _stored(host)}
    assert (kinds[old], kinds[new]) == ("text", "blob")
    assert audit.verify(host.app(), full=True)["ok"]
    assert [r["id"] for r in audit.rechecks(host.app())] == [new, old]


def test_a_packed_run_edited_afterwards_is_named(tmp_path: Path) -> None:
    host = make_fake_host(tmp_path)
    run = _run(host)
    [(_, _, raw)] = _stored(host)
    assert isinstance(raw, bytes)
    forged = unpack(raw).replace('"passed":false', '"passed":true').replace("running", "runnin")
    edited = pack(forged)
    assert isinstance(edited, bytes) and unpack(edited) != unpack(raw)
    report = verify_after_edit(
        host, "rechecks_no_update", "UPDATE rechecks SET assertions_json = ? WHERE id = ?", (edited, run)
    )
    named = [(p.get("key"), p["problem"]) for p in report["problems"] if p.get("table") == "rechecks"]
    assert named == [(run, EDITED)]
