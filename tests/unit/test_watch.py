"""The watch: the loop (samples in, verdict out) on a fake clock, and a watched promote on the
fake host: a healthy watch commits with its samples, a breach or a person's abort ends the
promote `rolled_back` and a rollback of its own (linked both ways) brings the incumbent back,
and a watch whose owner died is resumed by `recover`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import admin, audit, lifecycle, transactions
from anvil_ctl.core.errors import Refused
from anvil_ctl.core.ports import Owner
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.engine.owner import current_owner
from anvil_ctl.engine.plans.args import PromoteRequest
from anvil_ctl.engine.plans.promote import prepare
from anvil_ctl.engine.watch import Sample, watch, within
from anvil_ctl.qualify.watchpolicy import Limit
from tests.unit.clirun import in_process
from tests.unit.fakehost import FakeHost

PROFILE = """
name = "watch-unit"
[[gates]]
type = "smoke"
[watch]
duration = "{duration}"
interval_s = 0.05
requests = 1
max_tokens = 4
consecutive = 2
[[watch.thresholds]]
metric = "ttft_p95_s"
max = 1.0
[[watch.thresholds]]
metric = "fatal_log_lines"
max = 0
[[watch.thresholds]]
metric = "container_down"
max = 0
"""

TTFT = Limit("ttft_p95_s", "max", 1.0, "max 1")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _loop(
    values: list[float], *, duration_s: float = 10.0, stop_at: int | None = None
) -> tuple[object, list[Sample]]:
    clock, taken = FakeClock(), []

    def take(n: int) -> Sample:
        return {"n": n, "metrics": {"ttft_p95_s": values[min(n, len(values) - 1)]}}

    verdict = watch(
        duration_s=duration_s,
        interval_s=1.0,
        consecutive=2,
        judge=within([TTFT], 2),
        take=take,
        record=taken.append,
        stop=lambda: {"by": "alice"} if stop_at is not None and len(taken) >= stop_at else None,
        clock=clock.now,
        sleep=clock.sleep,
    )
    return verdict, taken


class TestTheLoop:
    def test_a_healthy_watch_samples_every_interval_until_the_end(self) -> None:
        verdict, taken = _loop([0.1], duration_s=5.0)
        assert verdict.ended == "healthy" and verdict.samples == 5  # type: ignore[attr-defined]
        assert [s["n"] for s in taken] == [0, 1, 2, 3, 4]

    def test_a_breach_is_a_limit_failed_by_consecutive_samples_and_ends_the_watch_at_once(self) -> None:
        verdict, taken = _loop([0.1, 2.0, 0.1, 2.0, 3.0, 0.1])
        assert verdict.ended == "breach" and len(taken) == 5  # type: ignore[attr-defined]
        (breach,) = verdict.breaches  # type: ignore[attr-defined]
        assert breach["metric"] == "ttft_p95_s" and breach["observed"] == [2.0, 3.0]
        assert [s["n"] for s in verdict.breaching] == [3, 4]  # type: ignore[attr-defined]

    def test_a_stop_ends_the_watch_and_names_who(self) -> None:
        verdict, taken = _loop([0.1], stop_at=2)
        assert verdict.ended == "stopped" and len(taken) == 2  # type: ignore[attr-defined]
        assert verdict.stopped_by == {"by": "alice"}  # type: ignore[attr-defined]

    def test_a_watch_shorter_than_its_interval_takes_one_sample(self) -> None:
        verdict, taken = _loop([0.1], duration_s=0.0)
        assert verdict.ended == "healthy" and len(taken) == 1  # type: ignore[attr-defined]


@pytest.fixture
def watched(fake_host: FakeHost, tmp_path: Path) -> Callable[..., FakeHost]:
    """`make(duration)`: a loaded candidate whose verified decision names a profile whose
    `[watch]` lasts `duration`, sampled every 0.05 s, two failing samples a breach."""

    def make(duration: str = "2s") -> FakeHost:
        profile = tmp_path / "watch-unit.toml"
        profile.write_text(PROFILE.format(duration=duration))
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        fake_host.decide(profile=str(profile))
        return fake_host

    return make


def _events(host: FakeHost, tx: str, event: str) -> list[dict[str, object]]:
    return [e.detail for e in host.app().store.step_events(tx) if e.step == "watch" and e.event == event]


class TestAWatchedPromote:
    def test_the_limits_are_journaled_with_the_promote_and_0_is_a_cutover(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        host = watched()
        args = prepare(host.app().world(), PromoteRequest(slot="primary", approved_by="alice"))
        assert args.watch is not None and args.watch.duration_s == pytest.approx(2.0)
        assert dict(args.watch.limits[0]) == {
            "metric": "ttft_p95_s",
            "op": "max",
            "limit": 1.0,
            "source": "max 1",
        }
        cut = prepare(host.app().world(), PromoteRequest(slot="primary", approved_by="alice", watch_s=0))
        assert cut.watch is None

    def test_a_healthy_watch_commits_with_its_samples_as_evidence(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        host = watched("3s")
        out = lifecycle.promote(host.app(), slot="primary", approved_by="alice")
        assert (out.state, out.exit_code, out.followed_by) == (TxState.COMMITTED, 0, None), out.reason
        assert out.tx_id is not None
        shown = audit.show(host.app(), out.tx_id)
        assert [st["state"] for st in shown["states"]][-2:] == ["watching", "committed"]
        assert shown["args"]["watch"]["limits"][0]["limit"] == 1.0  # declared with the promote
        samples = _events(host, out.tx_id, "sample")
        assert len(samples) >= 2 and all(s["metrics"]["ttft_p95_s"] == 0.01 for s in samples)  # type: ignore[index]
        (begin,) = _events(host, out.tx_id, "begin")
        assert begin["serve"] == shown["args"]["candidate"]["container_id"]
        assert shown["states"][-1]["data"]["watch"]["ended"] == "healthy"

    def test_a_limit_on_functional_failed_makes_every_sample_take_the_functional_checks(
        self, watched: Callable[..., FakeHost], tmp_path: Path
    ) -> None:
        host = watched("1s")
        profile = tmp_path / "watch-unit.toml"
        profile.write_text(
            profile.read_text() + '[[watch.thresholds]]\nmetric = "functional_failed"\nmax = 0\n'
        )
        out = lifecycle.promote(host.app(), slot="primary", approved_by="alice")
        assert out.state == TxState.COMMITTED and out.tx_id is not None, out.reason
        samples = _events(host, out.tx_id, "sample")
        assert samples and all(s["metrics"]["functional_failed"] == 0 for s in samples)  # type: ignore[index]
        assert [c["check"] for c in samples[0]["functional"]] == ["tool_call", "json"]  # type: ignore[union-attr]

    def test_a_breach_rolls_back_as_a_transaction_of_its_own_linked_both_ways(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        host = watched("30s")
        with host.world.edit() as w:
            w["route_sample_ttft_s"] = 2.5  # every answer's first token is slow
        out = lifecycle.promote(host.app(), slot="primary", approved_by="alice")
        assert out.state == TxState.ROLLED_BACK and out.exit_code == ExitCode.ROLLED_BACK == 10, out.reason
        back = out.followed_by
        assert back is not None and back.kind == "rollback" and back.state == TxState.COMMITTED, back
        assert out.tx_id is not None and back.tx_id is not None
        promote, rollback = audit.show(host.app(), out.tx_id), audit.show(host.app(), back.tx_id)
        assert promote["states"][-1]["data"]["followed_by"] == {"kind": "rollback", "tx_id": back.tx_id}
        decided = rollback["args"]["decided_by"]
        assert decided["policy"] == "watch" and decided["undoes"] == {"tx_id": out.tx_id, "kind": "promote"}
        assert decided["breaches"][0]["metric"] == "ttft_p95_s"
        assert decided["breaches"][0]["observed"] == [2.5, 2.5]
        assert len(decided["breaching_samples"]) == 2
        assert len(_events(host, out.tx_id, "sample")) == 2  # it ended at the breach
        incumbent = host.app().store.current_identity("primary", "incumbent")
        assert incumbent is not None and incumbent.container_id == host.incumbent_id

    def test_a_fatal_log_line_since_the_switch_is_a_breach_one_from_before_is_not(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        host = watched("30s")
        cand = host.app().store.current_identity("primary", "candidate")
        assert cand is not None
        line = "RuntimeError: CUDA error: an illegal memory access was encountered"
        host.world.append_log(cand.container_id, line)  # before the switch: not the watch's

        def print_once_watching() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                found = [r for r in host.app().store.unfinished() if r.state == TxState.WATCHING]
                if found and _events(host, found[0].id, "begin"):
                    host.world.append_log(cand.container_id, line)
                    return
                time.sleep(0.02)

        printer = threading.Thread(target=print_once_watching)
        printer.start()
        out = lifecycle.promote(host.app(), slot="primary", approved_by="alice")
        printer.join()
        assert out.state == TxState.ROLLED_BACK, out.reason
        assert out.followed_by is not None and out.followed_by.state == TxState.COMMITTED
        assert out.followed_by is not None and out.followed_by.state == TxState.COMMITTED
        assert "fatal_log_lines [1.0, 1.0]" in out.reason  # the one line after the switch

    def test_an_abort_from_another_process_rolls_back_as_a_persons_decision(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        host = watched("60s")
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anvil_ctl",
                "--json",
                "promote",
                "--slot",
                "primary",
                "--approved-by",
                "a",
            ],
            env=host.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            aborted = _abort_when_watching(host)
            _out, stderr = child.communicate(timeout=60)
        finally:
            child.kill()
        assert child.returncode == 10, stderr
        assert aborted["state"] == "rolled_back" and aborted["rollback"], aborted
        decided = audit.show(host.app(), str(aborted["rollback"]))["args"]["decided_by"]
        assert (decided["policy"], decided["by"], decided["reason"], decided["via"]) == (
            "person",
            "bob",
            "latency report from a client",
            "promote --abort",
        )

    def test_an_abort_with_nothing_watched_is_refused(self, fake_host: FakeHost) -> None:
        with pytest.raises(Refused, match="nothing to abort"):
            lifecycle.abort_watch(fake_host.app(), slot="primary", by="bob", reason="x", wait_s=0)


def _abort_when_watching(host: FakeHost) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return lifecycle.abort_watch(
                host.app(), slot="primary", by="bob", reason="latency report from a client", wait_s=60
            )
        except Refused:
            time.sleep(0.1)
    raise AssertionError("the promote never began watching")


def _died_watching(app: App, promoted: str, tx_id: str) -> tuple[Owner, str]:
    """The promote `promoted` again, as a process that died mid-watch left it (its owner dead,
    every step done, `watching`): what `recover` finds."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    me = current_owner()
    owner = Owner(pid=int(dead.stdout), hostname=me.hostname, boot_id=me.boot_id)
    shown = audit.show(app, promoted)
    tx = app.store.begin(kind="promote", slot="primary", args=shown["args"], owner=owner, tx_id=tx_id)
    app.store.transition(tx, TxState.RUNNING)
    for seq, step in enumerate(
        ["route-to-candidate", "smoke", "acceptance", "vram-after-acceptance", "record-promotion"]
    ):
        app.store.step_event(tx, seq=seq, step=step, phase="do", event="intent")
        app.store.step_event(tx, seq=seq, step=step, phase="do", event="result", detail={})
    app.store.transition(tx, TxState.WATCHING)
    return owner, tx


class TestRecoverDuringAWatch:
    def test_a_watch_whose_owner_died_is_resumed_and_commits(self, watched: Callable[..., FakeHost]) -> None:
        host = watched("0.5s")
        app = host.app()
        out = lifecycle.promote(app, slot="primary", approved_by="alice", watch_s=0.5)
        assert out.state == TxState.COMMITTED and out.tx_id
        owner, tx = _died_watching(app, out.tx_id, "tx-w")
        open_now = admin.status(app)["slots"]["primary"]["open"]
        assert open_now == [{"tx_id": tx, "kind": "promote", "state": "watching"}]  # status shows it
        report = transactions.recover_all(host.app())
        (done,) = report.recovered
        assert (done["state"], done["direction"]) == ("committed", "forward"), done
        assert len(_events(host, tx, "sample")) >= 1
        assert os.getpid() != owner.pid

    def test_a_watch_resumed_within_a_second_of_its_begin_says_it_resumed(
        self, watched: Callable[..., FakeHost]
    ) -> None:
        """A resume is told by the journaled begin, not by the time since it (the fresh-clone
        suite resumed one in under a second on a quiet machine, and no `resume` was recorded)."""
        host = watched("0.5s")
        app = host.app()
        out = lifecycle.promote(app, slot="primary", approved_by="alice", watch_s=5)
        assert out.state == TxState.COMMITTED and out.tx_id
        (began,) = _events(host, out.tx_id, "begin")
        _owner, tx = _died_watching(app, out.tx_id, "tx-r")
        app.store.step_event(
            tx, seq=5, step="watch", phase="watch", event="begin", detail={**began, "since": time.time()}
        )
        (done,) = transactions.recover_all(host.app()).recovered
        assert (done["state"], done["direction"]) == ("committed", "forward"), done
        (resumed,) = _events(host, tx, "resume")
        assert 4.0 < float(str(resumed["left_s"])) <= 5.0, resumed
        assert len(_events(host, tx, "begin")) == 1  # the dead run's, not a second one


class TestWhatTheOperatorSees:
    def test_the_breach_its_rollback_and_their_links_on_the_terminal(
        self,
        watched: Callable[..., FakeHost],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        host = watched("30s")
        with host.world.edit() as w:
            w["route_sample_ttft_s"] = 2.5
        run = in_process(host, monkeypatch, capsys)
        promoted = run("promote", "--slot", "primary", "--approved-by", "alice", "--watch", "20s")
        assert promoted.code == 10, promoted.err
        assert "promote: rolled_back" in promoted.out and "then rollback: committed" in promoted.out
        assert "ttft_p95_s [2.5, 2.5] vs max 1.0" in promoted.out
        rollback_tx = promoted.out.split("then rollback: committed  (transaction ")[1].split(")")[0]
        shown = run("audit", "show", rollback_tx)
        assert "decided by: watch (" in shown.out, shown.out
        assert "breach: ttft_p95_s [2.5, 2.5] against max 1.0 (max 1)" in shown.out
        breaching = [ln for ln in shown.out.splitlines() if ln.startswith("    sample ")]
        assert len(breaching) == 2 and all("ttft_p95_s=2.5" in ln for ln in breaching), shown.out
        assert "undoes: promote " in shown.out
        promote_tx = shown.out.split("undoes: promote ")[1].split()[0]
        forward = run("audit", "show", promote_tx)
        assert f"followed by: rollback {rollback_tx}" in forward.out
        assert forward.out.count("watch: sample") == 2 and "state watching" in forward.out

    def test_watch_0_is_a_cutover_and_a_bad_duration_exits_2(
        self,
        watched: Callable[..., FakeHost],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        host = watched("30s")
        run = in_process(host, monkeypatch, capsys)
        bad = run("promote", "--slot", "primary", "--approved-by", "alice", "--watch", "soon")
        assert bad.code == 2 and "--watch" in bad.err
        cut = run("--json", "promote", "--slot", "primary", "--approved-by", "alice", "--watch", "0")
        assert cut.code == 0, cut.err
        assert "watch" not in cut.json()["results"]
        assert not _events(host, cut.json()["tx_id"], "begin")


class TestTheRoutersOwnErrorCount:
    """The router's count of the serve's failed answers, read passively with every sample as
    the growth since the watch began (None where the router keeps no count we read)."""

    def test_the_growth_since_the_watch_began_is_the_metric(self, fake_host: FakeHost) -> None:
        from anvil_ctl.engine.watch import route_baseline, route_sampler, router_errors
        from anvil_ctl.qualify.watchpolicy import DEFAULT

        world = fake_host.app().world()
        serve = fake_host.app().store.current_identity("primary", "incumbent")
        assert serve is not None
        url = world.config.slot("primary").base_url
        assert router_errors(world, serve) is None  # a router that keeps none: not judged
        with fake_host.world.edit() as w:
            w["router_errors"] = {url: 2}
        began = route_baseline(world, serve)
        assert began["router_errors_before"] == 2
        take = route_sampler(
            world, serve, requests=1, max_tokens=4, limits=DEFAULT.limits({}), baseline=began
        )
        assert take(0)["metrics"]["router_errors"] == 0  # type: ignore[index]
        with fake_host.world.edit() as w:
            w["router_errors"] = {url: 5}
        sample = take(1)
        assert sample["metrics"]["router_errors"] == 3 and sample["passive"]["router_errors"] == 3  # type: ignore[index]
