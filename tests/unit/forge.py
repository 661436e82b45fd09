"""The state database as a file, the way an operator with `sqlite3` or an attacker reads and
edits it: raw rows as stored, and a history row edited past its append-only trigger (drop
the trigger, write, put it back, so only the audit chain can tell), and what `audit verify`
names after that edit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from anvil_ctl.commands import audit
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence.coverage import RowKey
from tests.unit.fakehost import FakeHost

EDITED = "content edited: row digest differs from its journal entry"


def db_file(host: FakeHost) -> Path:
    """The fake host's SQLite state database."""
    return host.settings.state_dir / "anvil.db"


def raw_rows(host: FakeHost, sql: str, *args: object) -> list[tuple[object, ...]]:
    """`sql`'s rows as stored (BLOBs as bytes), read outside the Store."""
    con = sqlite3.connect(db_file(host))
    try:
        return [tuple(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def edit_past_trigger(db: Path, trigger: str, sql: str, params: tuple[object, ...] = ()) -> None:
    """Run `sql` with `trigger` (e.g. "step_events_no_update") dropped, then recreate it as it was."""
    con = sqlite3.connect(db)
    try:
        (ddl,) = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (trigger,)).fetchone()
        con.execute(f"DROP TRIGGER {trigger}")
        con.execute(sql, params)
        con.execute(ddl)
        con.commit()
    finally:
        con.close()


def verify_after_edit(
    host: FakeHost, trigger: str, sql: str, params: tuple[object, ...] = (), *, full: bool = True
) -> JSONObject:
    """Edit the fake host's database past `trigger`, then `audit verify` it: the report, not ok."""
    edit_past_trigger(db_file(host), trigger, sql, params)
    report = audit.verify(host.app(), full=full)
    assert not report["ok"]
    return report


def named(report: JSONObject) -> list[tuple[str | None, RowKey | None, str]]:
    """Each problem in `report` as (table, key, problem)."""
    return [(p.get("table"), p.get("key"), p["problem"]) for p in report["problems"]]
