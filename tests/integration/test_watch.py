"""`promote --watch` on real Docker with a real smg and the official client: each of the stub's
late faults, starting once the watch samples, rolls the promote back by itself (the breach
in the record, the incumbent serving again); a healthy watch commits; `promote --abort` from
another shell and SIGINT roll back as a person's decision; a promote killed (SIGKILL) while
watching is resumed by `recover` and converges. Every late fault rolls back on HAProxy too.

The host: an incumbent stub adopted and routed, a candidate loaded from a copy of
stub-393k-c1 with a `--late-fault` whose onset is a count of completions: the load and the
promote's smoke and acceptance make `ONSET` of them, so the fault meets the watch's first
samples. smg's Prometheus page is in the host config, so the router's own count of the
serve's failures (`router_errors`) is read as on HAProxy. The profile's `[watch]`: 8 s, a
sample a second of 2 short streamed chats, a breach is 2 failing samples in a row.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.core.states import ExitCode, TxState
from scripts.campaign import verified_decision
from scripts.routers import Proc, start_smg
from tests.integration.test_load_docker import variant
from tests.integration.test_recheck_campaign import CANDIDATE, anvilctl, close_host, loaded_host
from tests.integration.test_router_smg import Keys

pytestmark = pytest.mark.integration

WATCH = """
name = "watch-it"
[[gates]]
type = "smoke"
[watch]
duration = "8s"
interval_s = 1.0
requests = 2
max_tokens = 8
consecutive = 2
[[watch.thresholds]]
metric = "ttft_p95_s"
max = 1.5
[[watch.thresholds]]
metric = "decode_tps_p50"
min = 200
[[watch.thresholds]]
metric = "error_rate"
max = 0
[[watch.thresholds]]
metric = "finish_reason_missing"
max = 0
[[watch.thresholds]]
metric = "restarts"
max = 0
[[watch.thresholds]]
metric = "container_down"
max = 0
[[watch.thresholds]]
metric = "fatal_log_lines"
max = 0
"""

ONSET = 6
"""Completions the candidate answers before the watch's first sample (load, smoke, acceptance):
a fault from completion ONSET + 1 on meets the first sample. `exit` and `fatal-log` act once
the Nth completion is done, so they take ONSET + 1: they strike during the first sample."""
LATER = ("exit", "fatal-log")

FAULTS = {
    "slow-first-token:2.5": "ttft_p95_s",
    "slow-decode:20": "decode_tps_p50",
    "http-500": "error_rate",
    "truncate-stream": "finish_reason_missing",
    "fatal-log": "fatal_log_lines",
    "exit": "container_down",
}


def names_the_fault(fault: str, breached: list[str], samples: list[dict[str, Any]]) -> bool:
    """Whether a breach of the metrics `breached`, judged on `samples`, names `fault`. An exited
    serve fails the requests in flight before Docker reports it exited, so `exit` may breach
    first as `error_rate`; it is named when the newest sample shows the container down."""
    if FAULTS[fault] in breached:
        return True
    return fault == "exit" and "error_rate" in breached and samples[-1]["metrics"]["container_down"] == 1


@pytest.fixture
def watched(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[Callable[..., dict[str, Any]]]:
    """`make(*candidate_args)`: smg, the incumbent routed, the candidate loaded with those stub
    arguments and verified under the profile `watch.toml`."""
    made: list[tuple[dict[str, Any], Proc]] = []

    def make(*candidate_args: str) -> dict[str, Any]:
        smg = start_smg(workdir=tmp_path / "smg", admin_token=Keys.admin, client_token=Keys.client)
        host = loaded_host(
            tmp_path,
            stub_container,
            smg.url,
            candidate_args=candidate_args,
            metrics_url=smg.extra["metrics_url"],
        )
        made.append((host, smg))
        profile = tmp_path / "watch.toml"
        profile.write_text(WATCH)
        verified_decision(host["app"].store, "primary", "watch-{digest}", profile=str(profile))
        return host

    yield make
    for host, smg in made:
        close_host(host, runtime)
        smg.stop()


def _serving(host: dict[str, Any]) -> str:
    """The model the slot's binding serves now."""
    models = httpx.get("http://127.0.0.1:8001/v1/models", timeout=10).json()["data"]
    return str(models[0]["id"])


def _show(host: dict[str, Any], tx: str) -> dict[str, Any]:
    return dict(audit.show(host["app"], tx))


def _samples(shown: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["detail"] for e in shown["steps"] if e["step"] == "watch" and e["event"] == "sample"]


def _promote_child(host: dict[str, Any], watch: str) -> subprocess.Popen[str]:
    """`anvilctl promote --watch WATCH` in a child process, as an operator's shell runs it."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "anvil_ctl",
            "--json",
            "promote",
            "--slot",
            "primary",
            "--approved-by",
            "w",
            "--watch",
            watch,
        ],
        env=host["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reap(child: subprocess.Popen[str]) -> None:
    """The child gone and its pipes closed, whatever the test did."""
    if child.poll() is None:
        child.kill()
    child.communicate(timeout=60)


def _until_watching(host: dict[str, Any], child: subprocess.Popen[str]) -> str:
    """The promote's transaction ID once its watch took a sample (the child still running)."""
    store = host["app"].store
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        for rec in store.unfinished():
            events = store.step_events(rec.id) if rec.kind == "promote" else []
            if any(e.step == "watch" and e.event == "sample" for e in events):
                return rec.id
        time.sleep(0.2)
    raise AssertionError(f"the promote never watched: exit {child.poll()}, {child.stderr}")


class TestAWatchedPromote:
    def test_a_healthy_watch_commits_with_its_samples(self, watched: Callable[..., dict[str, Any]]) -> None:
        host = watched()
        out = lifecycle.promote(host["app"], slot="primary", approved_by="watch-test")
        assert (out.state, out.exit_code) == (TxState.COMMITTED, 0), out.reason
        shown = _show(host, str(out.tx_id))
        samples = _samples(shown)
        assert len(samples) >= 4, samples  # 8 s at one a second, on a loaded machine
        assert all(r["finish_reason"] and r["model"] for s in samples for r in s["requests"])
        assert all(s["metrics"]["container_down"] == 0 for s in samples)
        assert [st["state"] for st in shown["states"]][-2:] == ["watching", "committed"]
        assert _serving(host) == CANDIDATE

    @pytest.mark.parametrize("fault", sorted(FAULTS))
    def test_a_late_fault_rolls_back_by_itself_with_the_breach_in_the_record(
        self, watched: Callable[..., dict[str, Any]], fault: str
    ) -> None:
        host = watched("--late-fault", f"{fault}@{ONSET + (fault in LATER)}")
        out = lifecycle.promote(host["app"], slot="primary", approved_by="watch-test")
        assert out.state == TxState.ROLLED_BACK and out.exit_code == ExitCode.ROLLED_BACK, out.reason
        back = out.followed_by
        assert back is not None and back.state == TxState.COMMITTED, back.reason if back else out
        decided = _show(host, str(back.tx_id))["args"]["decided_by"]
        assert decided["policy"] == "watch" and decided["undoes"]["tx_id"] == out.tx_id
        breached = [b["metric"] for b in decided["breaches"]]
        assert names_the_fault(fault, breached, decided["breaching_samples"]), decided["breaches"]
        assert len(decided["breaching_samples"]) == 2
        promote = _show(host, str(out.tx_id))
        assert promote["states"][-1]["data"]["followed_by"]["tx_id"] == back.tx_id
        incumbent = host["app"].store.current_identity("primary", "incumbent")
        assert incumbent is not None and incumbent.container_id == host["incumbent"].id
        assert _serving(host) != CANDIDATE  # the old incumbent answers on the binding again
        if fault == "http-500":  # smg's own count of the worker's failures, read passively
            samples = _samples(promote)
            assert max(s["metrics"]["router_errors"] for s in samples) > 0, samples
        routed = anvilctl(host["env"], "--json", "recheck", "--slot", "primary")
        assert routed.returncode == 0, routed.stdout

    def test_an_abort_from_another_shell_rolls_back_as_a_persons_decision(
        self, watched: Callable[..., dict[str, Any]]
    ) -> None:
        host = watched()
        child = _promote_child(host, "5m")  # ends by the abort, long before
        try:
            tx = _until_watching(host, child)
            stop = ("--by", "bob", "--reason", "clients report truncated tool calls")
            aborted = anvilctl(host["env"], "--json", "promote", "--abort", "--slot", "primary", *stop)
            assert aborted.returncode == 0, aborted.stderr
            assert json.loads(aborted.stdout)["promote"] == tx
            _out, err = child.communicate(timeout=120)
        finally:
            _reap(child)
        assert child.returncode == ExitCode.ROLLED_BACK, err
        follow = _show(host, tx)["states"][-1]["data"]["followed_by"]
        decided = _show(host, follow["tx_id"])["args"]["decided_by"]
        assert (decided["policy"], decided["by"], decided["via"]) == ("person", "bob", "promote --abort")
        assert _serving(host) != CANDIDATE

    def test_ctrl_c_during_the_watch_rolls_back_as_a_persons_decision(
        self, watched: Callable[..., dict[str, Any]]
    ) -> None:
        host = watched()
        child = _promote_child(host, "5m")  # ends by the signal, long before
        try:
            tx = _until_watching(host, child)
            child.send_signal(signal.SIGINT)
            _out, err = child.communicate(timeout=120)
        finally:
            _reap(child)
        assert child.returncode == ExitCode.ROLLED_BACK, err
        follow = _show(host, tx)["states"][-1]["data"]["followed_by"]
        decided = _show(host, follow["tx_id"])["args"]["decided_by"]
        assert (decided["policy"], decided["via"]) == ("person", "SIGINT")
        assert _serving(host) != CANDIDATE

    def test_a_promote_killed_while_watching_is_resumed_by_recover(
        self, watched: Callable[..., dict[str, Any]]
    ) -> None:
        host = watched()
        child = _promote_child(host, "30s")  # recover watches what is left of it
        try:
            tx = _until_watching(host, child)
            child.send_signal(signal.SIGKILL)
        finally:
            _reap(child)
        assert host["app"].store.state(tx) == TxState.WATCHING  # the dead owner's last word
        assert _serving(host) == CANDIDATE  # never dark: the candidate serves meanwhile
        recovered = anvilctl(host["env"], "--json", "recover")
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        (done,) = json.loads(recovered.stdout)["recovered"]
        assert (done["tx_id"], done["state"], done["direction"]) == (tx, "committed", "forward"), done
        shown = _show(host, tx)
        assert [e["event"] for e in shown["steps"] if e["event"] == "resume"] == ["resume"]
        assert _serving(host) == CANDIDATE
        rechecked = anvilctl(host["env"], "--json", "recheck", "--slot", "primary")
        assert rechecked.returncode == 0, rechecked.stdout

    def test_recover_without_the_client_key_changes_nothing_and_converges_with_it(
        self, watched: Callable[..., dict[str, Any]]
    ) -> None:
        """An authentication failure is no verdict on the serve: `recover` without the router's
        client key refuses (exit 3) naming the missing variable before it writes anything;
        the promote still needs recover, the candidate still serves and is routed; the next
        `recover`, with the key, resumes the watch and commits."""
        host = watched()
        child = _promote_child(host, "30s")
        try:
            tx = _until_watching(host, child)
            child.send_signal(signal.SIGKILL)
        finally:
            _reap(child)
        store = host["app"].store

        def seen() -> tuple[Any, ...]:
            running = sorted(c.id for c in host["app"].world().runtime.list() if c.running)
            routed = host["app"].world().router.routed_chat("llm.primary")
            return store.state(tx), len(store.step_events(tx)), running, (routed.status, routed.model)

        before = seen()
        assert before[0] == TxState.WATCHING and before[3] == (200, CANDIDATE), before
        keyless = {k: v for k, v in host["env"].items() if k != "ANVIL_ROUTER_CLIENT_TOKEN"}
        refused = anvilctl(keyless, "--json", "recover")
        assert refused.returncode == ExitCode.REFUSED, refused.stdout + refused.stderr
        assert "ANVIL_ROUTER_CLIENT_TOKEN" in refused.stdout + refused.stderr
        assert "recover changed nothing" in refused.stdout + refused.stderr
        assert seen() == before  # the record and the host as the dead owner left them
        still = anvilctl(host["env"], "--json", "recheck", "--slot", "primary")  # still needs recover
        assert (still.returncode, json.loads(still.stdout)["phase"]) == (ExitCode.NEEDS_OPERATOR, "watching")
        recovered = anvilctl(host["env"], "--json", "recover")
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        (done,) = json.loads(recovered.stdout)["recovered"]
        assert (done["tx_id"], done["state"], done["direction"]) == (tx, "committed", "forward"), done
        assert _serving(host) == CANDIDATE


class TestOnHaproxy:
    @pytest.mark.parametrize("fault", sorted(FAULTS))
    def test_a_late_fault_rolls_back_by_itself_through_haproxy(self, tmp_path: Path, fault: str) -> None:
        """The same watch through HAProxy: the candidate turns faulty from the watch's first
        sample; the promote ends rolled_back naming the metric, the rollback commits, the
        incumbent is routed."""
        from tests.integration.conftest import campaign_host

        with campaign_host(tmp_path / "host", "haproxy") as host:
            variant(tmp_path, "late", ["--late-fault", f"{fault}@{ONSET + (fault in LATER)}"])
            loaded = host.run("load", str(tmp_path / "late.toml"), "--slot", "primary")
            assert loaded["state"] == "committed", loaded.get("reason")
            profile = tmp_path / "watch.toml"
            profile.write_text(WATCH)
            verified_decision(host.app().store, "primary", "watch-{digest}", profile=str(profile))
            out = host.run("promote", "--slot", "primary", "--approved-by", "watch-test")
            assert (out["_exit"], out["state"]) == (ExitCode.ROLLED_BACK, "rolled_back"), out.get("reason")
            assert out["followed_by"]["state"] == "committed", out["followed_by"]
            samples = _samples(_show({"app": host.app()}, out["tx_id"]))
            breached = [m for m in FAULTS.values() if f"{m} [" in out["reason"]]
            assert names_the_fault(fault, breached, samples), out["reason"]
            assert host.phase_of(host.observe()) == "A"  # the incumbent serves and is routed
            if fault == "http-500":  # HAProxy's own count of the server's 5xx, read passively
                assert max(s["metrics"]["router_errors"] for s in samples) > 0, samples
