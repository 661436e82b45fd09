"""recheck knows the campaign: between a committed load and its promote or rollback it judges
the state the campaign should have (phase `qualifying`), while a promote is open in its watch it
judges what the watch should hold (phase `watching`), and real drift in either still exits 6."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import lifecycle, recheck, serves, transactions
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.persistence import rechecks
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

QUALIFYING_NAMES = {
    "campaign",
    "candidate_container_running",
    "image_id",
    "config_fingerprint",
    "served_model",
    "context_tokens",
    "loopback_binding",
    "health",
    "gpu_owner",
    "expected_gpus_found",
    "no_candidate_running",
    "shm_residue_zero",
    "incumbent_retained",
    "tier_as_loaded",
}


def _load(host: FakeHost, name: str = "cand-393k") -> str:
    out = transactions.load(host.app(), slot="primary", candidate=host.candidate(name))
    assert out.state == TxState.COMMITTED, out.reason
    return str(out.results["start-candidate"]["container_id"])


def _failed(host: FakeHost) -> list[str]:
    r = recheck.recheck(host.app(), "primary")
    assert r.phase == "qualifying"
    assert r.exit_code == (0 if r.passed else 6)
    return r.failed


@pytest.fixture
def qualifying(fake_host: FakeHost) -> FakeHost:
    _load(fake_host)
    return fake_host


class TestQualifyingPhase:
    def test_a_committed_load_is_judged_as_the_campaign_and_passes(self, qualifying: FakeHost) -> None:
        result = recheck.recheck(qualifying.app(), "primary")
        assert (result.phase, result.exit_code, result.failed) == ("qualifying", 0, [])
        assert {a["name"] for a in result.assertions} == QUALIFYING_NAMES
        campaign = next(a["observed"] for a in result.assertions if a["name"] == "campaign")
        assert campaign["incumbent"] == qualifying.incumbent_id
        assert campaign["candidate"] != qualifying.incumbent_id
        row = rechecks.rechecks(qualifying.app().store)[0]
        assert row["passed"] is True

    def test_its_json_and_textfile_name_the_phase(
        self,
        qualifying: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> None:
        run: Run = in_process(qualifying, monkeypatch, capsys)
        prom = tmp_path / "anvil.prom"
        ran = run("--json", "recheck", "--slot", "primary", "--textfile", str(prom))
        assert ran.code == 0, ran.out + ran.err
        assert ran.json()["phase"] == "qualifying" and ran.json()["passed"] is True
        text = prom.read_text()
        assert 'anvil_recheck_phase{phase="qualifying",slot="primary"} 1.0' in text
        assert 'anvil_recheck_phase{phase="serving",slot="primary"} 0.0' in text
        assert 'anvil_recheck_passed{slot="primary"} 1.0' in text

    def test_a_stopped_candidate_is_drift(self, qualifying: FakeHost) -> None:
        cand = qualifying.app().store.current_identity("primary", "candidate")
        assert cand is not None
        with qualifying.world.edit() as w:
            w["containers"][cand.container_id]["status"] = "exited"
        assert "candidate_container_running" in _failed(qualifying)

    def test_a_started_incumbent_is_no_longer_retained(self, qualifying: FakeHost) -> None:
        with qualifying.world.edit() as w:
            w["containers"][qualifying.incumbent_id]["status"] = "running"
        assert "incumbent_retained" in _failed(qualifying)

    def test_a_removed_incumbent_is_drift(self, qualifying: FakeHost) -> None:
        with qualifying.world.edit() as w:
            del w["containers"][qualifying.incumbent_id]
        failed = _failed(qualifying)
        assert "incumbent_retained" in failed
        observed = next(
            a["observed"]
            for a in recheck.recheck(qualifying.app(), "primary").assertions
            if a["name"] == "incumbent_retained"
        )
        assert observed["status"] == "absent"

    def test_a_tier_readmitted_during_qualification_is_drift(self, qualifying: FakeHost) -> None:
        with qualifying.world.edit() as w:
            w["router"]["tiers"]["primary-local"]["state"] = "ready"
        assert _failed(qualifying) == ["tier_as_loaded"]

    def test_a_stray_candidate_beside_the_campaigns_is_drift(self, qualifying: FakeHost) -> None:
        rt = qualifying.app().world().runtime
        spec = qualifying.candidate("stray").spec
        cid = rt.create(type(spec)(**{**spec.__dict__, "env": (("FAKE_BINDING", "127.0.0.1:9002"),)}))
        rt.start(cid)
        assert _failed(qualifying) == ["no_candidate_running"]

    def test_repair_router_changes_nothing_while_qualifying(self, qualifying: FakeHost) -> None:
        with qualifying.world.edit() as w:
            w["router"]["tiers"]["primary-local"]["state"] = "ready"
        before = qualifying.world.read()
        r = recheck.recheck(qualifying.app(), "primary", repair=("router",))
        assert r.repair is None and r.failed == ["tier_as_loaded"]
        assert qualifying.world.read() == before


class TestThePhaseEnds:
    def test_a_promote_ends_the_campaign(self, qualifying: FakeHost) -> None:
        qualifying.decide()
        out = lifecycle.promote(qualifying.app(), slot="primary", approved_by="operator")
        assert out.state == TxState.COMMITTED, out.reason
        result = recheck.recheck(qualifying.app(), "primary")
        assert (result.phase, result.failed) == ("serving", [])

    def test_a_rollback_ends_the_campaign(self, qualifying: FakeHost) -> None:
        out = lifecycle.rollback(qualifying.app(), slot="primary")
        assert out.state == TxState.COMMITTED, out.reason
        result = recheck.recheck(qualifying.app(), "primary")
        assert (result.phase, result.failed) == ("serving", [])

    def test_a_compensated_promote_leaves_the_campaign_in_progress(self, qualifying: FakeHost) -> None:
        qualifying.decide()
        qualifying.world.set_fail("readmit", "HTTP 401 from the router")
        out: Any = lifecycle.promote(qualifying.app(), slot="primary", approved_by="operator")
        assert out.state == TxState.COMPENSATED, out.reason
        qualifying.world.set_fail("readmit", None)
        result = recheck.recheck(qualifying.app(), "primary")
        assert (result.phase, result.failed) == ("qualifying", [])

    def test_a_second_load_in_the_campaign_is_judged_by_its_candidate(self, qualifying: FakeHost) -> None:
        first = qualifying.app().store.current_identity("primary", "candidate")
        serves.unload(qualifying.app(), first.container_id, yes=True)  # type: ignore[union-attr]
        second = _load(qualifying, "cand-second")
        result = recheck.recheck(qualifying.app(), "primary")
        assert (result.phase, result.failed) == ("qualifying", [])
        campaign = next(a["observed"] for a in result.assertions if a["name"] == "campaign")
        assert campaign["candidate"] == second


class TestWaitRouter:
    """`--wait-router`: a router's start hook waits for the router to answer before judging."""

    def test_a_router_that_answers_after_a_while_is_waited_for(self, fake_host: FakeHost) -> None:
        fake_host.world.set_fail("probe_credentials", "connection refused", times=3)
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",), wait_router_s=30)
        assert result.passed and result.repair is None
        assert "probe_credentials" not in fake_host.world.read()["fail"]  # every refusal was met

    def test_a_router_that_never_answers_is_exit_7_recorded_as_unobserved(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        fake_host.world.set_fail("probe_credentials", "connection refused")
        result = recheck.recheck(fake_host.app(), "primary", repair=("router",), wait_router_s=0.3)
        assert (result.exit_code, result.up, result.repair) == (7, False, None)
        assert "did not answer within 0.3 s" in str(result.unavailable)
        (row,) = rechecks.rechecks(fake_host.app().store)
        assert (row["passed"], row["failed"]) == (False, ["observed"])
        prom = tmp_path / "anvil.prom"
        recheck.write_textfile(prom, result, now=1.0)
        assert 'anvil_recheck_up{slot="primary"} 0.0' in prom.read_text()

    def test_rejected_credentials_are_not_waited_out(self, fake_host: FakeHost) -> None:
        from anvil_ctl.core.errors import AuthRejected

        with fake_host.world.edit() as w:
            w["router"]["admin_token_ok"] = False
        with pytest.raises(AuthRejected):  # at once: waited out, it would be Unavailable
            recheck.recheck(fake_host.app(), "primary", wait_router_s=60)


WATCHING_NAMES = {
    "watch",
    "candidate_container_running",
    "image_id",
    "config_fingerprint",
    "served_model",
    "context_tokens",
    "loopback_binding",
    "health",
    "gpu_owner",
    "expected_gpus_found",
    "router_readiness",
    "route_holds",
    "routed_smoke",
    "no_candidate_running",
    "shm_residue_zero",
    "incumbent_retained",
}

# One sample at the switch, the next a minute later: the watch does not react to what a test
# changes on the host while it rechecks.
WATCH_PROFILE = """
name = "watch-recheck"
[[gates]]
type = "smoke"
[watch]
duration = "120s"
interval_s = 60
requests = 1
max_tokens = 4
consecutive = 2
[[watch.thresholds]]
metric = "ttft_p95_s"
max = 1.0
"""


@pytest.fixture
def watching(qualifying: FakeHost, tmp_path: Path) -> Iterator[FakeHost]:
    """A promote open in `watching` (its first sample taken), owned by this process; aborted
    and its rollback awaited at the end."""
    profile = tmp_path / "watch-recheck.toml"
    profile.write_text(WATCH_PROFILE)
    qualifying.decide(profile=str(profile))
    ended: list[Any] = []
    promoter = threading.Thread(
        target=lambda: ended.append(lifecycle.promote(qualifying.app(), slot="primary", approved_by="alice"))
    )
    promoter.start()
    store = qualifying.app().store
    deadline = time.monotonic() + 60
    while not _sampled(store) and promoter.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _sampled(store), f"the promote never began watching: {ended}"
        yield qualifying
    finally:
        if store.watching("primary") is not None:
            lifecycle.abort_watch(qualifying.app(), slot="primary", by="bob", reason="test over", wait_s=60)
        promoter.join(60)
    assert not promoter.is_alive() and ended[0].state == TxState.ROLLED_BACK, ended


def _sampled(store: Any) -> bool:
    rec = store.watching("primary")
    return rec is not None and any(e.event == "sample" for e in store.step_events(rec.id))


def _watch_failed(host: FakeHost) -> list[str]:
    r = recheck.recheck(host.app(), "primary")
    assert (r.phase, r.exit_code) == ("watching", 0 if r.passed else 6), r.assertions
    return r.failed


class TestWatchingPhase:
    def test_a_watched_promote_is_judged_as_the_watch_and_passes(self, watching: FakeHost) -> None:
        result = recheck.recheck(watching.app(), "primary")
        assert (result.phase, result.exit_code, result.failed) == ("watching", 0, []), result.assertions
        assert {a["name"] for a in result.assertions} == WATCHING_NAMES
        watch = next(a["observed"] for a in result.assertions if a["name"] == "watch")
        promote = watching.app().store.watching("primary")
        assert promote is not None
        assert watch["promote_tx"] == promote.id and watch["owner_alive"] is True and watch["needs"] is None
        assert watch["incumbent"] == watching.incumbent_id != watch["candidate"]

    def test_its_json_record_and_textfile_name_the_phase(
        self,
        watching: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> None:
        run: Run = in_process(watching, monkeypatch, capsys)
        prom = tmp_path / "anvil.prom"
        ran = run("--json", "recheck", "--slot", "primary", "--textfile", str(prom))
        assert ran.code == 0, ran.out + ran.err
        assert ran.json()["phase"] == "watching" and ran.json()["passed"] is True
        text = prom.read_text()
        assert 'anvil_recheck_phase{phase="watching",slot="primary"} 1.0' in text
        assert 'anvil_recheck_phase{phase="qualifying",slot="primary"} 0.0' in text
        assert 'anvil_recheck_passed{slot="primary"} 1.0' in text
        row = rechecks.rechecks(watching.app().store)[0]
        assert (row["id"], row["passed"]) == (ran.json()["recheck_id"], True)

    def test_a_stopped_candidate_is_drift(self, watching: FakeHost) -> None:
        cand = watching.app().store.current_identity("primary", "candidate")
        assert cand is not None
        with watching.world.edit() as w:
            w["containers"][cand.container_id]["status"] = "exited"
        assert "candidate_container_running" in _watch_failed(watching)

    def test_a_started_incumbent_is_no_longer_retained(self, watching: FakeHost) -> None:
        with watching.world.edit() as w:
            w["containers"][watching.incumbent_id]["status"] = "running"
        assert "incumbent_retained" in _watch_failed(watching)

    def test_a_removed_incumbent_is_drift(self, watching: FakeHost) -> None:
        with watching.world.edit() as w:
            del w["containers"][watching.incumbent_id]
        assert "incumbent_retained" in _watch_failed(watching)

    def test_a_route_pointing_elsewhere_is_drift_and_repair_does_not_act(self, watching: FakeHost) -> None:
        with watching.world.edit() as w:
            w["router"]["tiers"]["primary-local"]["url"] = "http://127.0.0.1:9999"
        assert "route_holds" in _watch_failed(watching)
        before = watching.world.read()
        r = recheck.recheck(watching.app(), "primary", repair=("router",))
        assert r.repair is None and "route_holds" in r.failed  # the watch owns the slot
        assert watching.world.read() == before

    def test_a_watch_whose_owner_is_gone_needs_recover_exit_5(
        self,
        watching: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        # The watch's owner is this process: /proc is made to say that it has exited.
        from anvil_ctl.engine import owner

        store = watching.app().store
        promote = store.watching("primary")
        assert promote is not None
        monkeypatch.setattr(owner, "pid_alive", lambda pid: pid != promote.owner.pid)
        ran = in_process(watching, monkeypatch, capsys)("--json", "recheck", "--slot", "primary")
        assert ran.code == ExitCode.NEEDS_OPERATOR == 5, ran.out + ran.err
        found = ran.json()
        assert (found["phase"], found["failed"]) == ("watching", ["watch"])
        watch = next(a["observed"] for a in found["assertions"] if a["name"] == "watch")
        assert (watch["owner_alive"], watch["needs"]) == (False, "recover")
        shown = in_process(watching, monkeypatch, capsys)("recheck", "--slot", "primary")
        assert shown.code == 5 and "NEEDS RECOVER" in shown.out, shown.out

    def test_a_promote_left_interrupted_by_a_failed_recover_needs_recover_exit_5(
        self,
        watching: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        # What `recover` leaves when it cannot finish the watch of a dead owner: the promote
        # `interrupted`, its candidate still routed. It is no campaign still qualifying.
        from anvil_ctl.engine import owner

        store = watching.app().store
        promote = store.watching("primary")
        assert promote is not None
        monkeypatch.setattr(owner, "pid_alive", lambda pid: pid != promote.owner.pid)
        store.transition(promote.id, TxState.INTERRUPTED, "recover could not finish it: a test's failure")
        try:
            ran = in_process(watching, monkeypatch, capsys)("--json", "recheck", "--slot", "primary")
            assert ran.code == ExitCode.NEEDS_OPERATOR == 5, ran.out + ran.err
            found = ran.json()
            assert (found["phase"], found["failed"]) == ("watching", ["watch"])
            watch = next(a["observed"] for a in found["assertions"] if a["name"] == "watch")
            assert (watch["promote_tx"], watch["state"], watch["needs"]) == (
                promote.id,
                "interrupted",
                "recover",
            )
        finally:  # the watch's owner (this process's thread) goes on to its abort at the end
            store.transition(promote.id, TxState.RUNNING, "test over")
            store.transition(promote.id, TxState.WATCHING, "test over")
