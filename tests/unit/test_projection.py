"""The current-state projection agrees with history, and its reads are indexed.

- After a random sequence of load, promote and rollback on the shipped fakes (clean,
  compensated, refused, killed at a random journal boundary and recovered), the
  projection the writers kept equals a rebuild from history, table by table.
- `EXPLAIN QUERY PLAN` of each README query, and of every query the guards, `status`,
  `recover`, `lock status` and `audit transactions/show` run, scans no history table.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import admin, audit, lifecycle, transactions
from anvil_ctl.commands.recheck import recheck
from anvil_ctl.persistence import projection, qualification
from anvil_ctl.persistence.current_models import PROJECTION_TABLES
from anvil_ctl.persistence.models import HISTORY_TABLES
from tests.pgserver import execute_as_attacker
from tests.unit.fakehost import FakeHost, make_fake_host

SLOT = "primary"
README = Path(__file__).resolve().parents[2] / "README.md"


def _verified(host: FakeHost, n: int) -> None:
    """A verified decision for the loaded candidate (what a passing `qualify` records)."""
    app = host.app()
    cand = app.store.current_identity(SLOT, "candidate")
    if cand is None:
        return
    qualification.record_decision(
        app.store,
        decision_id=f"dec-{n}",
        tx_id=None,
        slot=SLOT,
        identity_digest=cand.qualification_digest,
        container_id=cand.container_id,
        outcome="verified",
    )


def _compare(host: FakeHost) -> list[str]:
    with host.app().store.read() as s:
        return projection.compare(s)


def _maintained(host: FakeHost) -> dict[str, list[dict[str, Any]]]:
    with host.app().store.read() as s:
        return projection.maintained(s)


def _killed_at(host: FakeHost, boundary: str, run: Any) -> bool:
    """Run `run(child_host)` in a forked child that SIGKILLs itself at `boundary`; False
    when the child never got there (refused by a guard, or it took another path)."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            settings = host.settings.model_copy(update={"crash_at": boundary})
            app = App(settings=settings, env={})
            child = FakeHost(host.root, settings, host.world, host.image_id, host.incumbent_id)
            child.context = lambda: app  # type: ignore[method-assign]
            run(child)
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4:
        return False
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        pytest.fail(f"child did not die at {boundary}: status {status}")
    return True


def _boundaries(host: FakeHost, tx_id: str, kind: str) -> list[str]:
    shown = audit.show(host.app(), tx_id)
    rows = [f"{kind}:state:{s['state']}" for s in shown["states"]]
    rows += [f"{kind}:{e['step']}:{e['phase']}:{e['event']}" for e in shown["steps"]]
    return list(dict.fromkeys(rows))


class TestTheProjectionEqualsARebuildFromHistory:
    # Both seeds on SQLite, one on PostgreSQL (`backend` overrides the fixture's parameters).
    @pytest.mark.parametrize(("backend", "seed"), [("sqlite", 1), ("sqlite", 2), ("postgresql", 1)])
    def test_after_a_random_sequence_of_clean_compensated_refused_and_crashed_transactions(
        self, tmp_path: Path, seed: int, state_db: str | None
    ) -> None:
        rng = random.Random(seed)
        host = make_fake_host(tmp_path, state_db=state_db)
        assert _compare(host) == []
        seen: dict[str, list[str]] = {}
        states: list[str] = []
        for n in range(14):
            op = rng.choice(["load", "load", "load-fails", "promote", "promote-fails", "rollback", "crash"])
            app = host.app()
            if op == "load":
                out = transactions.load(app, slot=SLOT, candidate=host.candidate(name=f"cand-{n}"))
                if out.tx_id and out.state.value == "committed":
                    seen.setdefault("load", _boundaries(host, out.tx_id, "load"))
                    _verified(host, n)
            elif op == "load-fails":
                out = transactions.load(
                    app, slot=SLOT, candidate=host.candidate(name=f"bad-{n}", fail_health=True)
                )
            elif op == "promote":
                out = lifecycle.promote(app, slot=SLOT, approved_by="operator")
            elif op == "promote-fails":
                host.world.set_fail("acceptance", "injected", times=1)
                out = lifecycle.promote(app, slot=SLOT, approved_by="operator")
            elif op == "rollback":
                out = lifecycle.rollback(app, slot=SLOT)
                if out.tx_id and out.state.value == "committed":
                    seen.setdefault("rollback", _boundaries(host, out.tx_id, "rollback"))
            else:
                # A rollback runs on most states of the slot; a load only when nothing is loaded.
                kind = rng.choice(["rollback", "load"])
                boundary = rng.choice(seen.get(kind) or [f"{kind}:state:running"])

                def run(h: FakeHost, n: int = n, kind: str = kind) -> Any:
                    if kind == "rollback":
                        return lifecycle.rollback(h.app(), slot=SLOT)
                    return transactions.load(h.app(), slot=SLOT, candidate=h.candidate(name=f"k-{n}"))

                died = _killed_at(host, boundary, run)
                with host.world.edit() as w:
                    w["fail"], w["fail_times"] = {}, {}
                assert _compare(host) == [], f"after the kill at {boundary}"
                transactions.recover_all(host.app())
                states.append(f"killed at {boundary}, recovered" if died else f"{kind}: not killed")
                assert _compare(host) == [], f"after recovering the kill at {boundary}"
                continue
            with host.world.edit() as w:
                w["fail"], w["fail_times"] = {}, {}
            states.append(f"{op}:{out.state.value}")
            assert _compare(host) == [], states
        for outcome in (":committed", ":compensated", ", recovered"):  # each kind was exercised
            assert any(s.endswith(outcome) for s in states), (outcome, states)

    def test_each_projection_table_is_checked(self, tmp_path: Path) -> None:
        host = make_fake_host(tmp_path)
        assert sorted(_maintained(host)) == sorted(PROJECTION_TABLES)

    def test_a_projection_row_edited_by_hand_is_named_by_a_full_verify(self, fake_host_on: FakeHost) -> None:
        host = fake_host_on
        transactions.load(host.app(), slot=SLOT, candidate=host.candidate())
        execute_as_attacker(
            host.settings.db_url, "UPDATE tx_current SET state = 'needs_operator'", past_triggers=False
        )
        report = audit.verify(host.app(), full=True)
        assert report["ok"]  # the record itself is intact: the projection is not history
        assert report["projection_differs"] == ["tx_current"]


class TestTheProjectionIsNotHistory:
    def test_no_projection_table_is_covered_by_the_chain(self) -> None:
        assert not set(PROJECTION_TABLES) & set(HISTORY_TABLES)

    def test_snapshot_bodies_are_history_and_stored_once_per_content(self, tmp_path: Path) -> None:
        assert "snapshot_blobs" in HISTORY_TABLES
        host = make_fake_host(tmp_path)
        for _ in range(2):
            lifecycle.rollback(host.app(), slot=SLOT, dry_run=True)
            transactions.load(host.app(), slot=SLOT, candidate=host.candidate())
            lifecycle.rollback(host.app(), slot=SLOT)
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        snaps = con.execute("SELECT count(*), count(DISTINCT sha256) FROM snapshots").fetchone()
        blobs = con.execute("SELECT count(*) FROM snapshot_blobs").fetchone()[0]
        con.close()
        assert blobs == snaps[1] < snaps[0]
        assert audit.verify(host.app(), full=True)["ok"]


# -- query plans -------------------------------------------------------------------------------

SCAN = re.compile(r"^SCAN (\w+)")


def _readme_queries() -> list[str]:
    text = README.read_text()
    found = re.findall(r'sqlite3 state/anvil\.db "((?:[^"\\]|\\.)*)"', text)
    return [" ".join(q.replace('\\"', '"').split()) for q in found]


PARTIAL_INDEXES = ("ix_decisions_waived",)
"""Partial indexes: a scan of one reads only the rows it holds (decisions with waivers)."""


def _history_scans(con: sqlite3.Connection, sql: str, params: Any = ()) -> list[str]:
    plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    return [
        p
        for p in plan
        if (m := SCAN.match(p))
        and m.group(1) in (*HISTORY_TABLES, "audit_journal")
        and not any(p.endswith(f"USING INDEX {ix}") for ix in PARTIAL_INDEXES)
    ]


OPERATOR_TABLES = ("waivers", "waiver_revocations", "hosts")
"""History written by a person's command (`waivers add/revoke`) or once per machine (`hosts`,
which `fleet status` lists whole), never once per transaction: read whole, and small at any
number of transactions."""


def _bounded(sql: str, scans: list[str]) -> bool:
    """A scan that cannot grow with the history: an operator table, or a walk in key order
    without a filter that stops at its LIMIT (the audit chain's head)."""
    tables = {SCAN.match(p).group(1) for p in scans}  # type: ignore[union-attr]
    sql = " ".join(sql.split())  # SQLAlchemy breaks its lines before WHERE and ORDER BY
    in_order = " LIMIT " in sql and " WHERE " not in sql and "ORDER BY" in sql
    return tables <= set(OPERATOR_TABLES) or in_order


def _story(host: FakeHost, cycles: int) -> FakeHost:
    """`cycles` load + promote + rollback on `host`, then a last load, each candidate verified."""
    for n in range(cycles):
        transactions.load(host.app(), slot=SLOT, candidate=host.candidate(name=f"c{n}"))
        _verified(host, n)
        lifecycle.promote(host.app(), slot=SLOT, approved_by="operator")
        lifecycle.rollback(host.app(), slot=SLOT)
        recheck(host.app(), SLOT)  # cron's history grows with it
    transactions.load(host.app(), slot=SLOT, candidate=host.candidate(name="last"))
    _verified(host, 9)
    return host


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    return _story(make_fake_host(tmp_path_factory.mktemp("plans")), cycles=2)


@pytest.fixture(scope="module")
def longer(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    """`populated`'s story with three times its cycles."""
    return _story(make_fake_host(tmp_path_factory.mktemp("plans-longer")), cycles=6)


def _every_read(host: FakeHost) -> list[tuple[str, Any]]:
    """The SELECTs the guards (dry runs), status, fleet status, audit (with shell completion of a
    transaction prefix), lock status, recover and recheck (the story ends in a qualification:
    the campaign's reads) run on `host`."""
    app = host.app()
    tx_id = audit.transactions(app, limit=1)[0]["tx_id"]
    with _statements(app) as seen:
        lifecycle.rollback(app, slot=SLOT, dry_run=True)
        lifecycle.promote(app, slot=SLOT, approved_by="operator", dry_run=True)
        transactions.load(app, slot=SLOT, candidate=host.candidate(name="x"), dry_run=True)
        admin.status(app)
        audit.fleet_status(app)
        audit.transactions(app, limit=20)
        audit.rechecks(app, slot=SLOT, limit=20)
        audit.show(app, tx_id[:8])
        audit.completion_ids(app, "transaction", tx_id[:3])  # shell completion of a prefix
        transactions.lock_status(app)
        transactions.recover_all(app)
        recheck(app, SLOT)
    return seen


def _each_steps(db: Path, statements: list[tuple[str, Any]]) -> list[int]:
    """The SQLite virtual machine steps each execution of `statements` took on `db` (read
    only): what a statement costs, whatever the machine's load."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    counter = [0]

    def step() -> int:
        counter[0] += 1
        return 0

    con.set_progress_handler(step, 1)
    taken = []
    try:
        for sql, params in statements:
            counter[0] = 0
            con.execute(sql, params).fetchall()
            taken.append(counter[0])
    finally:
        con.close()
    return taken


def vm_steps(db: Path, statements: list[tuple[str, Any]]) -> dict[str, int]:
    """SQL text -> the most steps one execution of it took on `db` (`_each_steps`)."""
    steps: dict[str, int] = {}
    for (sql, _), n in zip(statements, _each_steps(db, statements), strict=True):
        steps[sql] = max(steps.get(sql, 0), n)
    return steps


def total_steps(db: Path, statements: list[tuple[str, Any]]) -> int:
    """The steps of every execution of `statements` on `db`, summed: a walk in pages repeats
    one statement, each page as dear, which the most one execution took (`vm_steps`) does
    not show."""
    return sum(_each_steps(db, statements))


def _statement_steps(host: FakeHost) -> dict[str, int]:
    """SQL text -> the most SQLite VM steps one execution of it took, for every SELECT the
    guards (dry runs), status, audit, lock status and recover run on `host`."""
    return vm_steps(host.settings.state_dir / "anvil.db", _every_read(host))


@contextmanager
def _statements(app: App) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and not many:
            seen.append((statement, params))

    event.listen(app.store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(app.store.engine, "before_cursor_execute", record)


class TestQueryPlans:
    def test_the_readme_lists_the_queries_this_test_checks(self) -> None:
        assert len(_readme_queries()) >= 6

    @pytest.mark.parametrize("index", range(6))
    def test_no_readme_query_scans_a_history_table(self, populated: FakeHost, index: int) -> None:
        sql = _readme_queries()[index]
        con = sqlite3.connect(populated.settings.state_dir / "anvil.db")
        try:
            assert _history_scans(con, sql) == [], sql
            con.execute(sql).fetchall()
        finally:
            con.close()

    def test_no_guard_status_recover_lock_or_audit_query_scans_a_history_table(
        self, populated: FakeHost
    ) -> None:
        seen = _every_read(populated)
        assert len(seen) > 20
        con = sqlite3.connect(populated.settings.state_dir / "anvil.db")
        try:
            found = {sql: _history_scans(con, sql, params) for sql, params in seen}
        finally:
            con.close()
        bad = {
            " ".join(sql.split())[:160]: scans
            for sql, scans in found.items()
            if scans and not _bounded(sql, scans)
        }
        assert bad == {}

    def test_no_guard_status_recover_lock_or_audit_query_costs_more_with_more_history(
        self, populated: FakeHost, longer: FakeHost
    ) -> None:
        """The work SQLite does for each statement (virtual machine steps, counted on a copy of
        the database) is the same with 3x the history. A search through an index whose
        matches grow with history (every transaction of a slot) followed by a sort is not a
        SCAN, so the plan test above let `rollback`'s served-snapshot query through: it read
        every snapshot of the slot and sorted them (238 ms at 100k transactions)."""
        small, large = _statement_steps(populated), _statement_steps(longer)
        assert len(small) > 20
        grown = {
            " ".join(sql.split())[:160]: (small[sql], large[sql])
            for sql in small.keys() & large.keys()
            if large[sql] > small[sql] * 1.5 + 200
        }
        assert grown == {}
        # nor runs more often: a walk in pages is one statement run again, each page as dear
        runs = [Counter(sql for sql, _ in _every_read(h)) for h in (populated, longer)]
        more = {" ".join(q.split())[:160]: (runs[0][q], n) for q, n in runs[1].items() if n > runs[0][q]}
        assert more == {}

    @pytest.mark.parametrize("reader", ["guards", "fleet status"])
    @pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
    def test_every_unresolved_query_reads_an_index_of_unresolved_rows_only(
        self, populated: FakeHost, tmp_path: Path, analyzed: bool, reader: str
    ) -> None:
        """Every mutation's guard asks for its host's unresolved transactions, and `fleet
        status` for each host's. Ordered by time and with the fleet's host condition, SQLite
        had preferred the (host_id, created_at) index, which walks every transaction of the
        host (178 ms at 100k, analyzed as the scale benchmark's databases are); `fleet status`
        compared `unresolved` with a bound parameter, which the partial index's condition
        does not prove, and walked it too (184 ms at 100k). An index holding only unresolved
        rows must answer both, with or without the planner's statistics."""
        db = tmp_path / "copy.db"
        src = sqlite3.connect(populated.settings.state_dir / "anvil.db")
        con = sqlite3.connect(db)
        try:
            src.backup(con)
            if analyzed:
                con.execute("ANALYZE")
            app = populated.app()
            with _statements(app) as seen:
                if reader == "guards":
                    app.store.unresolved()
                else:
                    audit.fleet_status(app)
            (sql, params) = next((q, p) for q, p in seen if "FROM tx_current" in q)
            assert "host_id" in sql
            plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            # either index holds only the unresolved transactions' rows
            assert len(plan) == 1 and plan[0] in (
                "SCAN tx_current USING INDEX ix_tx_current_unresolved",
                "SEARCH tx_current USING INDEX ix_tx_current_state (state=?)",
            ), plan
        finally:
            src.close()
            con.close()
