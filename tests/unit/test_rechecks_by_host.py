"""A host's newest recheck runs are found by a search (migration 0020, `ix_rechecks_host_key_id`),
whatever the other hosts sharing the database recorded since.

`audit rechecks` and `fleet status` asked for `host_id = :host OR host_id IS NULL` (rows from
before 0009 have no host: the first host's) newest first, which only a walk of the table from
its newest row could answer: every run another host recorded since, and for a host that never
rechecked (which `fleet status` asks about too) the whole table. They now compare
`coalesce(host_id, 1)` (`scope.host_key`), which the index serves for every host alike.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from alembic import command

from anvil_ctl.commands import audit, fleet
from anvil_ctl.commands.recheck import recheck
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config, upgrade
from anvil_ctl.persistence.models import RecheckRow
from anvil_ctl.persistence.scope import HOST_KEY_SQL
from tests.unit.fakehost import FakeHost
from tests.unit.test_fleet import SLOT, _fleet
from tests.unit.test_projection import _statements, vm_steps

INDEX = "ix_rechecks_host_key_id"


def _index_sql(db: Path) -> str | None:
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT sql FROM sqlite_schema WHERE name = ?", (INDEX,)).fetchone()
    return None if row is None else str(row[0])


def _runs(db: Path, host_id: int | None, count: int) -> None:
    """`count` recheck rows of `host_id`, written straight into the table (reads are measured
    here, not the journal: these rows have no audit entry)."""
    with sqlite3.connect(db) as con:
        con.executemany(
            "INSERT INTO rechecks (slot, passed, failed_json, assertions_json, snapshot_sha256, at, host_id)"
            " VALUES (?, 1, '[]', '[]', ?, ?, ?)",
            [(SLOT, "0" * 64, f"2026-12-03T00:00:{i % 60:02d}.000000Z", host_id) for i in range(count)],
        )


def _reads(host: FakeHost, other: FakeHost) -> dict[str, tuple[str, Any]]:
    """The rechecks SELECTs of `host`'s `audit rechecks` (with and without a slot) and of `fleet
    status` (which asks for each host's newest run), by what asked them."""
    app, other_app = host.app(), other.app()
    found: dict[str, tuple[str, Any]] = {}
    for name, asker, call in (
        ("audit rechecks", app, lambda: audit.rechecks(app, limit=20)),
        ("audit rechecks --slot", app, lambda: audit.rechecks(app, slot=SLOT, limit=20)),
        ("fleet status", other_app, lambda: fleet.status(other_app)),
    ):
        with _statements(asker) as seen:
            call()
        for i, (sql, params) in enumerate(q for q in seen if "FROM rechecks" in q[0]):
            found[f"{name} {i}"] = (sql, params)
    return found


def _steps(db: Path, sql: str, params: Any) -> int:
    """SQLite virtual machine steps of one execution (what the statement costs, load aside)."""
    return vm_steps(db, [(sql, params)])[sql]


def test_0020_makes_the_index_of_the_host_key_and_its_downgrade_takes_it_back(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    engine = make_engine(f"sqlite:///{db}", create=True)
    upgrade(engine)
    made = _index_sql(db)
    assert made is not None and "coalesce(host_id, 1), id" in made, made
    # the model declares the expression the queries compare (`scope.host_key`)
    (index,) = [ix for ix in RecheckRow.__table__.indexes if ix.name == INDEX]
    assert [str(e) for e in index.expressions] == [HOST_KEY_SQL, "rechecks.id"]
    cfg = alembic_config(engine)
    command.downgrade(cfg, "0019")
    assert _index_sql(db) is None
    command.upgrade(cfg, "head")
    assert _index_sql(db) == made
    engine.dispose()


def test_a_hosts_newest_runs_cost_the_same_whatever_another_host_recorded_since(tmp_path: Path) -> None:
    a, b = _fleet(tmp_path, None)
    db = a.settings.state_dir / "anvil.db"
    assert recheck(b.app(), SLOT).recheck_id is not None
    _runs(db, None, 1)  # a row from before hosts were recorded: the first host's (a's)
    _runs(db, 1, 20)
    small = {k: _steps(db, sql, p) for k, (sql, p) in _reads(b, a).items()}
    _runs(db, 1, 3000)  # a rechecks for weeks; b does not
    large = {k: _steps(db, sql, p) for k, (sql, p) in _reads(b, a).items()}
    assert len(small) >= 4 and small.keys() == large.keys()
    grown = {k: (small[k], large[k]) for k in small if large[k] > small[k] * 1.5 + 50}
    assert grown == {}, grown
    # what each host reads is its own: b its one run, a every other run, the unowned one too
    assert [r["id"] for r in audit.rechecks(b.app(), limit=5000)] == [1]
    assert len(audit.rechecks(a.app(), limit=5000)) == 1 + 20 + 3000
    got = {h["host"]: h["last_recheck"] for h in fleet.status(a.app())}
    assert got["gpu-b"] is not None and got["gpu-a"] is not None
    for sql, params in _reads(b, a).values():
        with sqlite3.connect(db) as con:
            plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        assert plan == [f"SEARCH rechecks USING INDEX {INDEX} (<expr>=?)"], (sql, plan)
