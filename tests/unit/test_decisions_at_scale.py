"""Decisions are found by their indexes, never by reading every decision recorded.

Before migration 0021, promote's acceptance step (the checks a waived gate excuses), every
qualify (its raw decision and what reclassifies it), `gpu waive` (per decision it re-judges)
and `report` read every decision of the host to pick one or two out; `audit decisions` listed
all of them (33k rows, ~1 s at 100k transactions) and `audit incumbents` every identity.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from anvil_ctl.commands import audit
from anvil_ctl.commands.evidence import audit_decisions
from anvil_ctl.engine.plans.promote import waived_checks
from anvil_ctl.engine.reclassify import reclassify_decisions
from anvil_ctl.persistence import qualification
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.forge import db_file
from tests.unit.test_projection import _statements, vm_steps

SLOT = "primary"


def _decide(host: FakeHost, n: int) -> None:
    """`n` raw decisions of `n` identities, every third reclassified (a waiver's), on `host`."""
    store = host.app().store
    for i in range(n):
        common = {"slot": SLOT, "identity_digest": f"{i:064x}", "container_id": "c" * 64}
        raw = f"dec-raw-{i:06d}"
        qualification.record_decision(
            store, decision_id=raw, tx_id=None, outcome="policy-infeasible", **common
        )
        if i % 3 == 0:
            qualification.record_decision(
                store,
                decision_id=f"dec-new-{i:06d}",
                tx_id=None,
                outcome="verified",
                reclassifies=raw,
                waiver_ids=["wvr-1"],
                **common,
            )


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeHost, FakeHost]:
    """Two hosts: one with 30 raw decisions, one with 10 times as many."""
    out = []
    for n in (30, 300):
        host = make_fake_host(tmp_path_factory.mktemp(f"decisions-{n}"))
        _decide(host, n)
        out.append(host)
    return out[0], out[1]


def _reads(host: FakeHost) -> list[tuple[str, Any]]:
    """The SELECTs of each lookup that picks one decision, or a few, out of all of them."""
    app = host.app()
    with _statements(app) as seen:
        assert len(audit_decisions(app, slot=SLOT, limit=5)) == 5
        assert len(audit_decisions(app, limit=5)) == 5
        assert qualification.decision(app.store, "dec-raw-000003") is not None
        assert [d["id"] for d in qualification.reclassifications(app.store, ["dec-raw-000003"])] == [
            "dec-new-000003"
        ]
        assert qualification.latest_decision(app.store, f"{3:064x}") is not None
        assert waived_checks(app.world(), "dec-new-000003") == {}
    return seen


def test_what_they_read_costs_the_same_with_ten_times_the_decisions(
    hosts: tuple[FakeHost, FakeHost],
) -> None:
    small, large = (vm_steps(db_file(h), _reads(h)) for h in hosts)
    assert any("FROM decisions" in sql for sql in small)
    grew = {
        " ".join(sql.split())[:160]: (small[sql], large[sql])
        for sql in small.keys() & large.keys()
        if large[sql] > small[sql] * 1.5 + 50
    }
    assert grew == {}


def test_each_reads_an_index_of_the_decisions(hosts: tuple[FakeHost, FakeHost]) -> None:
    """A search, or (the newest, under a LIMIT) a walk of `ix_decisions_at` from its end; the
    test above shows the walk stops."""
    reads = [(sql, p) for sql, p in _reads(hosts[1]) if "FROM decisions" in sql]
    with sqlite3.connect(db_file(hosts[1])) as con:
        for sql, params in reads:
            plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            walks = [p for p in plan if p.startswith("SCAN decisions")]
            assert walks in ([], ["SCAN decisions USING INDEX ix_decisions_at"]), (sql, plan)
            assert not walks or " LIMIT " in " ".join(sql.split()), (sql, plan)


def test_the_newest_decisions_are_the_tail_of_all_of_them_oldest_first(
    hosts: tuple[FakeHost, FakeHost],
) -> None:
    app = hosts[0].app()
    every = qualification.decisions(app.store)
    assert len(every) == 40
    for limit in (1, 7, 40, 100):
        assert audit_decisions(app, limit=limit) == every[-limit:]
    # reclassifications of several decisions at once, oldest first, and none for a reclassification
    raws = [d["id"] for d in every if d["reclassifies"] is None][:7]
    assert qualification.reclassifications(app.store, raws) == [d for d in every if d["reclassifies"] in raws]
    assert qualification.reclassifications(app.store, ["dec-new-000003"]) == []
    assert qualification.decision(app.store, "dec-missing") is None


def test_audit_decisions_and_incumbents_take_a_limit(
    hosts: tuple[FakeHost, FakeHost], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    anvilctl: Run = in_process(hosts[0], monkeypatch, capsys)
    r = anvilctl("audit", "decisions", "--limit", "3", "--json")
    assert r.code == 0, r.err
    assert [d["id"] for d in r.json()] == [
        d["id"] for d in qualification.decisions(hosts[0].app().store)[-3:]
    ]
    assert len(anvilctl("audit", "decisions", "--json").json()) == 40  # 50 by default
    bad = anvilctl("audit", "decisions", "--limit", "0")
    assert bad.code == 2 and "--limit" in bad.err


def test_incumbents_newest_first_by_key_then_oldest_first(tmp_path: Any) -> None:
    from tests.unit.test_projection import _story

    host = _story(make_fake_host(tmp_path), cycles=2)
    app = host.app()
    for slot in (SLOT, None):
        every = audit.identities(app, slot=slot, limit=10_000)
        assert len(every) >= 4
        for limit in (1, 3):
            assert audit.identities(app, slot=slot, limit=limit) == every[-limit:]
    with _statements(app) as seen:
        audit.identities(app, slot=SLOT, limit=3)
    (sql, params) = next((q, p) for q, p in seen if "v_identities" in q)
    with sqlite3.connect(db_file(host)) as con:
        plan = [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    assert any("ix_identities_slot_role_id" in p for p in plan), plan
    assert not [p for p in plan if "TEMP B-TREE" in p], plan  # walked in key order, no sort


def test_a_waiver_re_judges_decisions_by_their_own_chains(hosts: tuple[FakeHost, FakeHost]) -> None:
    """`gpu waive`'s re-judging reads each raw decision's reclassifications through the index
    (the decisions here have no standing policy, so each is passed over, as before)."""
    app = hosts[0].app()
    report = reclassify_decisions(app.world(), slot=SLOT)
    assert report.recorded == [] and report.skipped == []
