"""A serve leaves traffic only once it answers nothing: the drain waits, refuses or cuts, and says so."""

from __future__ import annotations

import pytest

from anvil_ctl.commands import audit, lifecycle, serves, transactions
from anvil_ctl.core.model import DrainPolicy
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.engine.outcome import Outcome
from tests.unit.fakehost import FakeHost


def _in_flight(host: FakeHost, container_id: str, count: int, *, stuck: bool = False) -> None:
    with host.world.edit() as w:
        w["containers"][container_id]["in_flight"] = count
        w["containers"][container_id]["in_flight_stuck"] = stuck


def _load(host: FakeHost, drain: DrainPolicy | None = None) -> Outcome:
    return transactions.load(host.app(), slot="primary", candidate=host.candidate(), drain=drain)


def _drain_detail(host: FakeHost, tx_id: str, step: str) -> dict[str, object]:
    shown = audit.show(host.app(), tx_id)
    results = [s["detail"] for s in shown["steps"] if s["step"] == step and s["event"] == "result"]
    assert results, f"no result of {step} in {shown['steps']}"
    drain = results[-1]["drain"]
    assert isinstance(drain, dict)
    return drain


class TestLoad:
    def test_waits_until_the_incumbents_answers_in_flight_are_done_before_stopping_it(
        self, fake_host: FakeHost
    ) -> None:
        _in_flight(fake_host, fake_host.incumbent_id, 3)
        out = _load(fake_host)
        assert out.state == TxState.COMMITTED, out.reason
        drain = out.results["stop-incumbent"]["drain"]
        # the fake finishes one answer per look: the drain-tier step's look saw 3, the stop's 2
        assert drain == {**drain, "in_flight": 2, "cut": 0, "source": "router"}
        assert fake_host.world.read()["containers"][fake_host.incumbent_id]["in_flight"] == 0

    def test_the_drain_reads_what_is_in_flight_while_the_incumbent_is_still_routed(
        self, fake_host: FakeHost
    ) -> None:
        _in_flight(fake_host, fake_host.incumbent_id, 3)
        out = _load(fake_host)
        assert out.state == TxState.COMMITTED, out.reason
        assert out.results["drain-tier"] == {
            "tier": "primary-local",
            "in_flight_before": 3,
            "source": "router",
        }

    def test_refuses_at_the_deadline_and_leaves_the_incumbent_routed_and_serving(
        self, fake_host: FakeHost
    ) -> None:
        _in_flight(fake_host, fake_host.incumbent_id, 2, stuck=True)
        out = _load(fake_host, DrainPolicy(deadline_s=0.2, on_timeout="abort"))
        assert out.state == TxState.COMPENSATED
        assert out.exit_code == ExitCode.REFUSED
        assert "2 answer(s) still in flight" in out.reason and "the serve is routed again" in out.reason
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        tier = world["router"]["tiers"]["primary-local"]
        assert (tier["url"], tier["state"]) == ("http://127.0.0.1:8001", "ready")
        assert [
            c for c in world["containers"].values() if c["labels"].get("io.anvil.role") == "candidate"
        ] == []

    def test_cut_at_the_deadline_goes_on_and_counts_the_answers_cut(self, fake_host: FakeHost) -> None:
        _in_flight(fake_host, fake_host.incumbent_id, 2, stuck=True)
        out = _load(fake_host, DrainPolicy(deadline_s=0.2, on_timeout="cut"))
        assert out.state == TxState.COMMITTED, out.reason
        assert _drain_detail(fake_host, out.tx_id or "", "stop-incumbent")["cut"] == 2


class TestRollback:
    def test_goes_on_at_the_deadline_and_the_record_counts_the_cut(self, fake_host: FakeHost) -> None:
        loaded = _load(fake_host)
        assert loaded.state == TxState.COMMITTED, loaded.reason
        cand_id = str(loaded.results["start-candidate"]["container_id"])
        _in_flight(fake_host, cand_id, 4, stuck=True)
        out = lifecycle.rollback(fake_host.app(), slot="primary", drain_timeout_s=0.2)
        assert out.state == TxState.COMMITTED, out.reason
        drain = _drain_detail(fake_host, out.tx_id or "", "stop-current")
        assert (drain["cut"], drain["in_flight"], drain["source"]) == (4, 4, "router")
        assert out.as_dict()["results"]["stop-current"]["drain"]["cut"] == 4  # type: ignore[index]

    def test_abort_makes_even_a_rollback_refuse_to_cut(self, fake_host: FakeHost) -> None:
        loaded = _load(fake_host)
        cand_id = str(loaded.results["start-candidate"]["container_id"])
        _in_flight(fake_host, cand_id, 1, stuck=True)
        out = lifecycle.rollback(
            fake_host.app(), slot="primary", drain_timeout_s=0.2, on_drain_timeout="abort"
        )
        assert (out.state, out.exit_code) == (TxState.COMPENSATED, ExitCode.REFUSED)
        assert fake_host.world.read()["containers"][cand_id]["status"] == "running"


class TestUnload:
    @pytest.fixture
    def candidate_id(self, fake_host: FakeHost) -> str:
        loaded = _load(fake_host)
        assert loaded.state == TxState.COMMITTED, loaded.reason
        return str(loaded.results["start-candidate"]["container_id"])

    def test_waits_for_the_answers_a_candidate_gives_directly(
        self, fake_host: FakeHost, candidate_id: str
    ) -> None:
        _in_flight(fake_host, candidate_id, 2)
        out = serves.unload(fake_host.app(), candidate_id, yes=True)
        assert isinstance(out, Outcome) and out.state == TxState.COMMITTED, out
        assert out.results["stop-candidate"]["drain"]["in_flight"] == 2
        assert candidate_id not in fake_host.world.read()["containers"]

    def test_refuses_at_the_deadline_and_removes_nothing(
        self, fake_host: FakeHost, candidate_id: str
    ) -> None:
        _in_flight(fake_host, candidate_id, 1, stuck=True)
        out = serves.unload(fake_host.app(), candidate_id, yes=True, drain_timeout_s=0.2)
        assert isinstance(out, Outcome)
        assert (out.state, out.exit_code) == (TxState.COMPENSATED, ExitCode.REFUSED)
        assert fake_host.world.read()["containers"][candidate_id]["status"] == "running"
