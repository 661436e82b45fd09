"""`audit history --limit N` and `rollback --to REF` do not read the whole history of the slot.

At 100k transactions `audit history --slot primary --limit 20` took 5.4 s (every revision's serve
read through one IN list of every transaction ID, then all but 20 dropped) and `rollback --to
CONTAINER` 9.8 s before its first guard (the same whole history to match REF as a transaction
prefix, then every identity of the slot read and sorted to find the newest naming the
container). The numbers and serves they answer are those of the whole history.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.persistence import queries
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.test_projection import SLOT, _statements, _story, vm_steps


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
    ctx = populated.context()
    every = audit.history(ctx, slot=SLOT, limit=10_000)
    assert len(every) >= 8 and [r["revision"] for r in every] == list(range(1, len(every) + 1))
    for limit in (1, 2, 5):
        assert audit.history(ctx, slot=SLOT, limit=limit) == every[-limit:]
    count, (third,) = queries.slot_revisions(ctx.store, SLOT, ctx.store.host, number=3)
    assert (count, third) == (len(every), every[2])


def test_a_transaction_prefix_finds_its_revision_numbered_as_in_the_whole_history(
    populated: FakeHost,
) -> None:
    ctx = populated.context()
    for rev in audit.history(ctx, slot=SLOT, limit=10_000):
        assert queries.slot_revisions_of(ctx.store, SLOT, ctx.store.host, rev["tx_id"][:8]) == [rev]
    assert queries.slot_revisions_of(ctx.store, SLOT, ctx.store.host, "zzzzzzzz") == []


def test_rollback_to_a_container_finds_its_newest_identity(populated: FakeHost) -> None:
    ctx = populated.context()
    incumbent = ctx.store.current_identity(SLOT, "incumbent")
    assert incumbent is not None
    found = lifecycle.resolve_to(ctx, SLOT, incumbent.container_id[:12])
    assert found.digest == incumbent.digest
    with pytest.raises(Exception, match="no revision, transaction or recorded identity"):
        lifecycle.resolve_to(ctx, SLOT, "f" * 12)


def _reads(host: FakeHost) -> list[tuple[str, Any]]:
    """The SELECTs of `audit history --limit 2` and of resolving `rollback --to` the incumbent's
    container (the usual REF: what served before) on `host`."""
    ctx = host.context()
    incumbent = ctx.store.current_identity(SLOT, "incumbent")
    assert incumbent is not None
    with _statements(ctx) as seen:
        audit.history(ctx, slot=SLOT, limit=2)
        lifecycle.resolve_to(ctx, SLOT, incumbent.container_id[:12])
    return seen


def test_what_they_read_beyond_counting_revisions_costs_the_same_with_three_times_the_history(
    stories: tuple[FakeHost, FakeHost],
) -> None:
    """Counting a slot's revisions (their numbers) still reads each one's row; nothing else they
    do may cost more with more history: not the serves (2 here, whatever the history), not the
    identity a container prefix names."""
    small, large = (vm_steps(h.settings.state_dir / "anvil.db", _reads(h)) for h in stories)
    counting = {sql for sql in small if "FROM v_transactions" in sql}
    assert counting, "the revisions are counted from v_transactions"
    rest = {
        " ".join(sql.split())[:160]: (small[sql], large[sql])
        for sql in small.keys() & large.keys()
        if sql not in counting and large[sql] > small[sql] * 1.5 + 50
    }
    assert rest == {}
    in_lists = [
        p for sql, p in _reads(stories[1]) if "FROM identities" in sql and "IN (" in " ".join(sql.split())
    ]
    assert in_lists and all(len(p) <= 4 for p in in_lists), in_lists  # 2 IDs, the slot and ''


def test_the_revision_count_reads_an_index_not_the_table(populated: FakeHost) -> None:
    ctx = populated.context()
    with _statements(ctx) as seen:
        audit.history(ctx, slot=SLOT, limit=2)
    (sql, params) = next((q, p) for q, p in seen if "FROM v_transactions" in q)
    with sqlite3.connect(Path(populated.settings.state_dir) / "anvil.db") as con:
        plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    assert not [p for p in plan if p.startswith("SCAN")], plan
