"""Editing a history row the way an attacker with the database file would: drop the table's
append-only trigger, write, put the trigger back (so only the audit chain can tell)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


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
