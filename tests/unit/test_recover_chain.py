"""An interrupted `load --promote` never leaves the slot dark (`anvil_ctl.engine.campaign`).

The load journals the promotion that follows it. A process killed between the load's commit
and the promotion's begin, or mid-promotion before its pivot, leaves the candidate serving
unrouted and the incumbent stopped: `recheck` pages (exit 5) and `recover` runs the
promotion; when that is refused or fails, `recover` brings the load's incumbent back. A chain
a person settled, or whose owner still runs it, is never recover's.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.bootstrap import App, UnresolvedCredentialsRouter
from anvil_ctl.commands import audit, lifecycle, recheck, serves
from anvil_ctl.core.errors import AuthRejected, CredentialError, LockHeld
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.engine import entry
from anvil_ctl.engine.runner import Faults
from anvil_ctl.recipes.model import load_recipe
from tests.unit.fakehost import FakeHost

RECIPE = "stub-245k-c1"


@pytest.fixture(autouse=True)
def _stub_image(fake_host: FakeHost) -> None:
    """The image the shipped stub recipe pins, present on the fake host."""
    image = load_recipe(Path(__file__).parents[2] / "recipes" / f"{RECIPE}.toml").image
    with fake_host.world.edit() as w:
        w["images"][image] = {"id": image, "tags": [], "repo_digests": []}


def _qualified_and_back(host: FakeHost) -> str:
    """The recipe loaded once and verified (its qualification digest outlives the container),
    then rolled back: the incumbent serves and routes again. The incumbent's container ID."""
    assert serves.load(host.app(), RECIPE, slot="primary").state == TxState.COMMITTED
    host.decide("verified")
    assert lifecycle.rollback(host.app(), slot="primary").state == TxState.COMMITTED
    incumbent = host.app().store.current_identity("primary", "incumbent")
    assert incumbent is not None
    return incumbent.container_id


def _killed_at(host: FakeHost, boundary: str) -> None:
    """`load --promote` in a forked child that SIGKILLs itself right after `boundary` commits."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            settings = host.settings.model_copy(update={"crash_at": boundary})
            serves.load(App(settings=settings, env={}), RECIPE, slot="primary", promote_approved_by="alice")
            code = 4  # the boundary was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def _recover_killed_at(host: FakeHost, boundary: str) -> None:
    """`recover` in a forked child that SIGKILLs itself right after `boundary` commits."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            app = App(settings=host.settings, env={})
            entry.recover(app.world(), app.owner, faults=Faults(crash_at=boundary))
            code = 4  # the boundary was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def _tier(host: FakeHost) -> Any:
    return host.world.read()["router"]["tiers"]["primary-local"]


def _running(host: FakeHost) -> set[str]:
    return {cid for cid, c in host.world.read()["containers"].items() if c["status"] == "running"}


def _newest(host: FakeHost, kind: str) -> dict[str, Any]:
    return next(dict(t) for t in audit.transactions(host.app(), limit=20) if t["kind"] == kind)


def _chained(host: FakeHost) -> dict[str, Any]:
    """The newest load, whose journaled arguments name the promotion that follows it."""
    load = _newest(host, "load")
    args = audit.show(host.app(), load["tx_id"])["args"]
    assert args["then"] == {
        "slot": "primary",
        "approved_by": "alice",
        "candidate": None,
        "accept_drift": None,
        "watch_s": None,
        "chain": None,
    }
    return load


def _dark(host: FakeHost) -> str:
    """Phase B after the kill: the candidate runs, the incumbent is stopped, nothing routed."""
    cand = host.app().store.current_identity("primary", "candidate")
    assert cand is not None
    assert _running(host) == {cand.container_id}
    assert _tier(host)["state"] == "drain"
    return cand.container_id


class TestRecoverFinishesTheChain:
    @pytest.mark.parametrize(
        "boundary",
        [
            "load:state:committed",  # between the load's commit and the promotion's begin
            "promote:state:planned",  # while the promotion's guards ran
            "promote:route-to-candidate:do:intent",  # mid-promotion, before its pivot's result
        ],
    )
    def test_a_kill_before_the_promotion_s_pivot_ends_promoted_and_routed(
        self, fake_host: FakeHost, boundary: str
    ) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, boundary)
        load = _chained(fake_host)
        assert load["state"] == "committed"
        candidate = _dark(fake_host) if boundary != "promote:route-to-candidate:do:intent" else None

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)

        assert report.exit_code == 0, report.recovered
        chained = [r for r in report.recovered if "chain" in r]
        assert len(chained) == 1 and chained[0]["state"] == "committed", report.recovered
        assert load["tx_id"] in str(chained[0]["reason"])
        promote = _newest(fake_host, "promote")
        assert (promote["tx_id"], promote["state"]) == (chained[0]["tx_id"], "committed")
        incumbent = fake_host.app().store.current_identity("primary", "incumbent")
        cand = fake_host.app().store.current_identity("primary", "candidate")
        assert incumbent is not None and cand is not None and incumbent.container_id == cand.container_id
        assert candidate in (None, cand.container_id)
        assert _tier(fake_host)["state"] == "ready" and _running(fake_host) == {cand.container_id}
        assert recheck.recheck(fake_host.app(), "primary").exit_code == 0
        again = entry.recover(fake_host.app().world(), fake_host.app().owner)
        assert again.recovered == [], again.recovered  # settled: never run twice

    def test_a_promotion_refused_at_recover_brings_the_load_s_incumbent_back(
        self, fake_host: FakeHost
    ) -> None:
        incumbent = _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        load = _newest(fake_host, "load")
        _dark(fake_host)
        fake_host.decide("failed", decision_id="d-2")  # the identity is no longer verified

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)

        promoted, back = [r for r in report.recovered if r["kind"] in ("promote", "rollback")]
        assert promoted["state"] == "refused" and "chain" in promoted, report.recovered
        assert (back["kind"], back["state"]) == ("rollback", "committed"), back
        assert report.exit_code == 0
        assert _running(fake_host) == {incumbent} and _tier(fake_host)["state"] == "ready"
        now = fake_host.app().store.current_identity("primary", "incumbent")
        assert now is not None and now.container_id == incumbent
        decided = audit.show(fake_host.app(), str(back["tx_id"]))["args"]["decided_by"]
        assert decided["policy"] == "recover" and decided["undoes"] == {
            "kind": "load",
            "tx_id": load["tx_id"],
        }
        assert decided["promotion"]["state"] == "refused" and "load --promote" in decided["why"]
        assert recheck.recheck(fake_host.app(), "primary").exit_code == 0
        assert entry.recover(fake_host.app().world(), fake_host.app().owner).recovered == []

    def test_an_incumbent_that_cannot_come_back_either_ends_recover_with_exit_5(
        self, fake_host: FakeHost
    ) -> None:
        incumbent = _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        fake_host.decide("failed", decision_id="d-2")
        with fake_host.world.edit() as w:
            del w["containers"][incumbent]  # the retained incumbent removed behind our back

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)

        promoted, back = report.recovered
        assert (promoted["state"], back["kind"], back["dark"]) == ("refused", "rollback", True), back
        assert back["state"] != "committed" and report.exit_code == ExitCode.NEEDS_OPERATOR


class TestARecoverKilledWhileItFinishesTheChain:
    """The first `recover` is killed running the chain's promotion or its bring-back: its
    transactions name the load (not its owner), so the next `recover` still finishes the chain."""

    @pytest.mark.parametrize(
        "boundary",
        [
            "promote:state:planned",  # while the promotion's guards ran
            "promote:route-to-candidate:do:intent",  # mid-promotion, before its pivot's result
        ],
    )
    def test_killed_in_the_promotion_before_its_pivot_the_next_recover_promotes_and_routes(
        self, fake_host: FakeHost, boundary: str
    ) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        load = _chained(fake_host)
        _recover_killed_at(fake_host, boundary)
        cut = _newest(fake_host, "promote")
        assert audit.show(fake_host.app(), cut["tx_id"])["args"]["chain"] == load["tx_id"]
        checked = recheck.recheck(fake_host.app(), "primary")  # still paged: nothing finished it
        assert checked.failed == ["chain"] and checked.exit_code == ExitCode.NEEDS_OPERATOR

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)

        assert report.exit_code == 0, report.recovered
        (chained,) = [r for r in report.recovered if "chain" in r]
        assert chained["state"] == "committed" and chained["tx_id"] != cut["tx_id"], report.recovered
        assert chained["chain"]["cut"] == [cut["tx_id"]]  # type: ignore[index]
        assert audit.show(fake_host.app(), str(chained["tx_id"]))["args"]["chain"] == load["tx_id"]
        cand = fake_host.app().store.current_identity("primary", "candidate")
        incumbent = fake_host.app().store.current_identity("primary", "incumbent")
        assert cand is not None and incumbent is not None and incumbent.container_id == cand.container_id
        assert _tier(fake_host)["state"] == "ready" and _running(fake_host) == {cand.container_id}
        assert recheck.recheck(fake_host.app(), "primary").exit_code == 0

    @pytest.mark.parametrize(
        "boundary",
        [
            "rollback:state:planned",  # while the bring-back's guards ran
            "rollback:release-vram:do:intent",  # the candidate stopped, the incumbent not yet back
        ],
    )
    def test_killed_in_the_bring_back_the_next_recover_ends_with_the_incumbent_serving(
        self, fake_host: FakeHost, boundary: str
    ) -> None:
        incumbent = _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        load = _chained(fake_host)
        fake_host.decide("failed", decision_id="d-2")  # recover's promotion is refused
        _recover_killed_at(fake_host, boundary)
        refused, cut = _newest(fake_host, "promote"), _newest(fake_host, "rollback")
        assert refused["state"] == "refused" and cut["state"] != "committed", cut
        assert _tier(fake_host)["state"] != "ready" or _running(fake_host) != {incumbent}

        report = entry.recover(fake_host.app().world(), fake_host.app().owner)

        assert report.exit_code == 0, report.recovered
        promoted, back = [r for r in report.recovered if "chain" in r or r.get("dark") is not None]
        assert (promoted["tx_id"], promoted["state"]) == (refused["tx_id"], "refused"), promoted
        assert promoted["chain"]["promoted"] == refused["tx_id"]  # type: ignore[index]
        assert (back["kind"], back["state"], back["dark"]) == ("rollback", "committed", False), back
        kinds = [t["kind"] for t in audit.transactions(fake_host.app(), limit=20)]
        assert kinds.count("promote") == 1  # the refused promotion is not run again
        decided = audit.show(fake_host.app(), str(back["tx_id"]))["args"]["decided_by"]
        assert decided["undoes"] == {"kind": "load", "tx_id": load["tx_id"]}
        assert decided["promotion"]["tx_id"] == refused["tx_id"]
        now = fake_host.app().store.current_identity("primary", "incumbent")
        assert now is not None and now.container_id == incumbent
        assert _running(fake_host) == {incumbent} and _tier(fake_host)["state"] == "ready"
        assert recheck.recheck(fake_host.app(), "primary").exit_code == 0

    def test_a_recover_after_the_one_that_finished_the_chain_finds_nothing(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        _recover_killed_at(fake_host, "promote:route-to-candidate:do:intent")
        finished = entry.recover(fake_host.app().world(), fake_host.app().owner)
        assert [r["state"] for r in finished.recovered if "chain" in r] == ["committed"], finished.recovered
        before = audit.transactions(fake_host.app(), limit=20)
        serving = (_running(fake_host), _tier(fake_host)["state"])

        again = entry.recover(fake_host.app().world(), fake_host.app().owner)

        assert again.recovered == [] and again.exit_code == 0, again.recovered
        assert audit.transactions(fake_host.app(), limit=20) == before
        assert (_running(fake_host), _tier(fake_host)["state"]) == serving and serving[1] == "ready"

    def test_a_recover_still_running_the_chain_s_promotion_is_not_paged(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        pause = fake_host.settings.pause_file
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                app = App(settings=fake_host.settings, env={})
                faults = Faults(pause_at="promote:state:planned", pause_file=pause)
                code = entry.recover(app.world(), app.owner, faults=faults).exit_code
            finally:
                os._exit(code)
        try:
            deadline = time.monotonic() + 30
            while not pause.exists():
                assert time.monotonic() < deadline, "recover never began the chain's promotion"
                time.sleep(0.02)
            checked = recheck.recheck(fake_host.app(), "primary")
            assert (checked.phase, checked.exit_code) == ("qualifying", 0), checked.failed
            chain = next(a for a in checked.assertions if a["name"] == "chain")
            assert chain["passed"] and chain["observed"]["owner_alive"] is True, chain
        finally:
            pause.unlink(missing_ok=True)
            _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert _newest(fake_host, "promote")["state"] == "committed"


class TestWhatIsNotRecoversBusiness:
    def test_a_chain_a_person_rolled_back_is_never_touched(self, fake_host: FakeHost) -> None:
        incumbent = _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        _chained(fake_host)
        assert lifecycle.rollback(fake_host.app(), slot="primary").state == TxState.COMMITTED
        report = entry.recover(fake_host.app().world(), fake_host.app().owner)
        assert report.recovered == [] and _running(fake_host) == {incumbent}
        assert _newest(fake_host, "rollback")["state"] == "committed"
        assert [t["kind"] for t in audit.transactions(fake_host.app(), limit=2)] == ["rollback", "load"]

    def test_a_chain_a_person_s_refused_promote_settled_stays_as_it_was(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        _chained(fake_host)
        fake_host.decide("failed", decision_id="d-2")
        out = lifecycle.promote(fake_host.app(), slot="primary", approved_by="bob")
        assert out.state == TxState.REFUSED
        candidate = _dark(fake_host)
        report = entry.recover(fake_host.app().world(), fake_host.app().owner)
        assert report.recovered == [] and _running(fake_host) == {candidate}
        # the person was told by their promote's exit; recheck judges a plain campaign
        assert recheck.recheck(fake_host.app(), "primary").exit_code == 0

    def test_a_live_owner_still_running_its_chain_is_not_paged_nor_recovered(
        self, fake_host: FakeHost
    ) -> None:
        _qualified_and_back(fake_host)
        pause = fake_host.settings.pause_file
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                settings = fake_host.settings.model_copy(update={"pause_at": "load:state:committed"})
                out = serves.load(
                    App(settings=settings, env={}), RECIPE, slot="primary", promote_approved_by="alice"
                )
                code = out.exit_code
            finally:
                os._exit(code)
        try:
            deadline = time.monotonic() + 30
            while not pause.exists():
                assert time.monotonic() < deadline, "the load never reached its commit"
                time.sleep(0.02)
            checked = recheck.recheck(fake_host.app(), "primary")
            assert (checked.phase, checked.exit_code) == ("qualifying", 0), checked.failed
            chain = next(a for a in checked.assertions if a["name"] == "chain")
            assert chain["passed"] and chain["observed"]["owner_alive"] is True
            with pytest.raises(LockHeld):
                entry.recover(fake_host.app().world(), fake_host.app().owner)
        finally:
            pause.unlink(missing_ok=True)
            _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert _newest(fake_host, "promote")["state"] == "committed"


class TestRecheckPages:
    def test_phase_b_after_an_interrupted_chain_exits_5_naming_recover(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        checked = recheck.recheck(fake_host.app(), "primary")
        assert checked.phase == "qualifying" and checked.failed == ["chain"], checked.assertions
        assert checked.needs_recover and checked.exit_code == ExitCode.NEEDS_OPERATOR
        (chain,) = (a["observed"] for a in checked.assertions if a["name"] == "chain")
        assert "load --promote" in chain["needs"] and "anvilctl recover" in chain["needs"]

    def test_a_plain_load_s_phase_b_still_passes(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        assert serves.load(fake_host.app(), RECIPE, slot="primary").state == TxState.COMMITTED
        assert audit.show(fake_host.app(), _newest(fake_host, "load")["tx_id"])["args"]["then"] is None
        checked = recheck.recheck(fake_host.app(), "primary")
        assert (checked.phase, checked.exit_code) == ("qualifying", 0), checked.failed
        assert "chain" not in [a["name"] for a in checked.assertions]


class TestWithoutTheRoutersKey:
    def test_recover_changes_nothing_and_names_the_interrupted_chain(self, fake_host: FakeHost) -> None:
        _qualified_and_back(fake_host)
        _killed_at(fake_host, "load:state:committed")
        world = fake_host.app().world()
        world.router = UnresolvedCredentialsRouter(
            CredentialError("router client token not found", kind="client", tried="env")
        )
        before = audit.transactions(fake_host.app(), limit=5)
        with pytest.raises(AuthRejected) as refused:
            entry.recover(world, fake_host.app().owner)
        assert "load --promote" in str(refused.value)
        assert audit.transactions(fake_host.app(), limit=5) == before
