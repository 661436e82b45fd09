"""A host's newest recheck runs are found by a search (`ix_rechecks_host_id_id`), whatever the
other hosts sharing the database recorded since: `audit rechecks` and `fleet status` (which
asks about every host, one that never rechecked too) never walk the table from its newest row.
"""

from __future__ import annotations

import sqlite3
import zlib
from pathlib import Path
from typing import Any

from anvil_ctl.commands import audit
from anvil_ctl.commands.recheck import recheck
from tests.unit.fakehost import FakeHost
from tests.unit.test_fleet import SLOT, _fleet
from tests.unit.test_projection import _statements, vm_steps

INDEX = "ix_rechecks_host_id_id"


def _runs(db: Path, host_id: int, count: int) -> None:
    """`count` recheck rows of `host_id`, written straight into the table (reads are measured
    here, not the journal: these rows have no audit entry)."""
    with sqlite3.connect(db) as con:
        con.executemany(
            "INSERT INTO rechecks (slot, passed, failed_json, assertions_json, snapshot_sha256, at, host_id)"
            " VALUES (?, 1, '[]', ?, ?, ?, ?)",
            [
                (SLOT, zlib.compress(b"[]"), "0" * 64, f"2026-12-03T00:00:{i % 60:02d}.000000Z", host_id)
                for i in range(count)
            ],
        )


def _reads(host: FakeHost, other: FakeHost) -> dict[str, tuple[str, Any]]:
    """The rechecks SELECTs of `host`'s `audit rechecks` (with and without a slot) and of `fleet
    status` (which asks for each host's newest run), by what asked them."""
    app, other_app = host.app(), other.app()
    found: dict[str, tuple[str, Any]] = {}
    for name, asker, call in (
        ("audit rechecks", app, lambda: audit.rechecks(app, limit=20)),
        ("audit rechecks --slot", app, lambda: audit.rechecks(app, slot=SLOT, limit=20)),
        ("fleet status", other_app, lambda: audit.fleet_status(other_app)),
    ):
        with _statements(asker) as seen:
            call()
        for i, (sql, params) in enumerate(q for q in seen if "FROM rechecks" in q[0]):
            found[f"{name} {i}"] = (sql, params)
    return found


def _steps(db: Path, sql: str, params: Any) -> int:
    """SQLite virtual machine steps of one execution (what the statement costs, load aside)."""
    return vm_steps(db, [(sql, params)])[sql]


def test_a_hosts_newest_runs_cost_the_same_whatever_another_host_recorded_since(tmp_path: Path) -> None:
    a, b = _fleet(tmp_path, None)
    db = a.settings.state_dir / "anvil.db"
    assert recheck(b.app(), SLOT).recheck_id is not None
    _runs(db, 1, 21)
    small = {k: _steps(db, sql, p) for k, (sql, p) in _reads(b, a).items()}
    _runs(db, 1, 3000)  # a rechecks for weeks; b does not
    large = {k: _steps(db, sql, p) for k, (sql, p) in _reads(b, a).items()}
    assert len(small) >= 4 and small.keys() == large.keys()
    grown = {k: (small[k], large[k]) for k in small if large[k] > small[k] * 1.5 + 50}
    assert grown == {}, grown
    # what each host reads is its own: b its one run, a every other run
    assert [r["id"] for r in audit.rechecks(b.app(), limit=5000)] == [1]
    assert len(audit.rechecks(a.app(), limit=5000)) == 1 + 20 + 3000
    got = {h["host"]: h["last_recheck"] for h in audit.fleet_status(a.app())}
    assert got["gpu-b"] is not None and got["gpu-a"] is not None
    for sql, params in _reads(b, a).values():
        with sqlite3.connect(db) as con:
            plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        assert plan == [f"SEARCH rechecks USING INDEX {INDEX} (host_id=?)"], (sql, plan)
