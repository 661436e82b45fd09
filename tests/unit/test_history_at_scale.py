"""`audit history --limit N` and `rollback --to REF` do not read the whole history of the slot.

At 100k transactions `audit history --slot primary --limit 20` took 5.4 s (every revision's serve
read through one IN list of every transaction ID, then all but 20 dropped) and `rollback --to
CONTAINER` 9.8 s before its first guard (the same whole history to match REF as a transaction
prefix, then every identity of the slot read and sorted to find the newest naming the
container). The projection keeps each revision's number, so nothing counts them. The numbers
and serves they answer are those of the whole history.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.engine.plans.rollback import resolve_target
from anvil_ctl.persistence import queries
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import db_file
from tests.unit.test_projection import SLOT, _statements, _story, total_steps, vm_steps


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeHost, FakeHost]:
    """Two hosts, one through `test_projection._story`'s 2 cycles, one through 3 times as many."""
    short, long = (_story(make_fake_host(tmp_path_factory.mktemp(f"history-{n}")), cycles=n) for n in (2, 6))
    return short, long


@pytest.fixture(scope="module")
def populated(stories: tuple[FakeHost, FakeHost]) -> FakeHost:
    return stories[0]


def test_the_newest_revisions_are_the_whole_historys_last_with_their_numbers_and_serves(
    populated: FakeHost,
) -> None:
    app = populated.app()
    every = audit.history(app, slot=SLOT, limit=10_000)
    assert len(every) >= 8 and [r["revision"] for r in every] == list(range(1, len(every) + 1))
    for limit in (1, 2, 5):
        assert audit.history(app, slot=SLOT, limit=limit) == every[-limit:]
    count, (third,) = queries.slot_revisions(app.store, SLOT, app.store.host, number=3)
    assert (count, third) == (len(every), every[2])


def test_a_transaction_prefix_finds_its_revision_numbered_as_in_the_whole_history(
    populated: FakeHost,
) -> None:
    app = populated.app()
    for rev in audit.history(app, slot=SLOT, limit=10_000):
        assert queries.slot_revisions(app.store, SLOT, app.store.host, tx_prefix=rev["tx_id"][:8])[1] == [rev]
    assert queries.slot_revisions(app.store, SLOT, app.store.host, tx_prefix="zzzzzzzz")[1] == []


def test_rollback_to_a_revision_brings_back_the_serve_it_left(populated: FakeHost) -> None:
    app = populated.app()
    for rev in audit.history(app, slot=SLOT, limit=10_000):
        if rev["serve"] is None:
            continue
        found = resolve_target(app.store, SLOT, str(rev["revision"]))
        assert (found.digest, found.container_id) == (
            rev["serve"]["identity_digest"],
            rev["serve"]["container_id"],
        )
        assert resolve_target(app.store, SLOT, rev["tx_id"][:12]) == found


def test_rollback_to_a_container_finds_its_newest_identity(populated: FakeHost) -> None:
    app = populated.app()
    incumbent = app.store.current_identity(SLOT, "incumbent")
    assert incumbent is not None
    found = resolve_target(app.store, SLOT, incumbent.container_id[:12])
    assert found.digest == incumbent.digest
    with pytest.raises(Exception, match="no revision, transaction or recorded identity"):
        resolve_target(app.store, SLOT, "f" * 12)


def _reads(host: FakeHost) -> list[tuple[str, Any]]:
    """The SELECTs of `audit history --limit 2` and of resolving `rollback --to` the incumbent's
    container (the usual REF: what served before) and `rollback --to 2` on `host`."""
    app = host.app()
    incumbent = app.store.current_identity(SLOT, "incumbent")
    assert incumbent is not None
    with _statements(app) as seen:
        audit.history(app, slot=SLOT, limit=2)
        resolve_target(app.store, SLOT, incumbent.container_id[:12])
        # the serve revision 2 left (the first candidate promoted): recorded early, never again
        assert resolve_target(app.store, SLOT, "2").container_id != incumbent.container_id
    return seen


def test_what_they_read_costs_the_same_with_three_times_the_history(
    stories: tuple[FakeHost, FakeHost],
) -> None:
    """Nothing they do costs more with more history: not their numbers (kept in the projection
    from migration 0021 on; counting them read every revision of the slot: 0.6 s of SQL at 100k
    transactions), not the serves (2 here, whatever the history), not the identity a container
    prefix names."""
    small, large = (vm_steps(h.settings.state_dir / "anvil.db", _reads(h)) for h in stories)
    assert any("FROM tx_current t" in sql for sql in small), "the revisions are read from the projection"
    grew = {
        " ".join(sql.split())[:160]: (small[sql], large[sql])
        for sql in small.keys() & large.keys()
        if large[sql] > small[sql] * 1.5 + 50
    }
    assert grew == {}
    # and all of them together: a walk in pages repeats one statement, each page as dear
    total = [total_steps(h.settings.state_dir / "anvil.db", _reads(h)) for h in stories]
    assert total[1] - total[0] <= 50, total  # 3x the history: the same steps (a walk adds 100s)

    in_lists = [
        p for sql, p in _reads(stories[1]) if "FROM identities" in sql and "IN (" in " ".join(sql.split())
    ]
    assert in_lists and all(len(p) <= 4 for p in in_lists), in_lists  # 2 IDs, the slot and ''


def test_each_revision_read_searches_the_revision_index(populated: FakeHost) -> None:
    app = populated.app()
    every = audit.history(app, slot=SLOT, limit=10_000)
    with _statements(app) as seen:
        audit.history(app, slot=SLOT, limit=2)
        queries.slot_revisions(app.store, SLOT, app.store.host, number=3)
        queries.slot_revisions(app.store, SLOT, app.store.host, tx_prefix=every[-1]["tx_id"][:8])[1]
    reads = [(q, p) for q, p in seen if "FROM tx_current" in q]
    assert len(reads) >= 4, reads  # the count and the newest, the count and one, the prefix's
    with sqlite3.connect(Path(populated.settings.state_dir) / "anvil.db") as con:
        for sql, params in reads:
            plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            assert any("ix_tx_current_revision" in p for p in plan) or any(
                "PRIMARY KEY" in p or "sqlite_autoindex_tx_current" in p for p in plan
            ), (sql, plan)
            assert not [p for p in plan if p.startswith("SCAN")], (sql, plan)


_COUNTED = """
    SELECT t.tx_id FROM v_transactions t WHERE t.slot = :slot AND t.host_id = :host
    AND t.kind IN ('adopt', 'load', 'promote', 'rollback')
    AND EXISTS (SELECT 1 FROM transaction_states r WHERE r.tx_id = t.tx_id AND r.state = 'running')
    ORDER BY (SELECT MIN(s.id) FROM transaction_states s WHERE s.tx_id = t.tx_id)
"""
"""A slot's revisions counted from history: in the order of each one's first state row."""


def test_the_numbers_kept_are_those_history_counts_and_a_rebuild_gives(
    tmp_path: Path,
) -> None:
    host = _story(make_fake_host(tmp_path), cycles=2)
    app = host.app()
    with sqlite3.connect(db_file(host)) as con:
        counted = [r[0] for r in con.execute(_COUNTED, {"slot": SLOT, "host": app.store.host})]
    every = audit.history(app, slot=SLOT, limit=10_000)
    assert len(counted) >= 8 and [r["tx_id"] for r in every] == counted
    assert [r["revision"] for r in every] == list(range(1, len(counted) + 1))

    assert audit.verify(app, full=True)["ok"]  # the projection equals a rebuild from history
    # and the next revision continues from the numbers it was given
    lifecycle.rollback(app, slot=SLOT)
    after = audit.history(app, slot=SLOT, limit=2)
    assert [r["revision"] for r in after] == [len(every), len(every) + 1]
