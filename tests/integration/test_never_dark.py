"""Never dark on real Docker and a real smg: kills at journal boundaries, router and daemon
restarts, renamed and removed retained serves, foreign shared memory; after each, `recover`
and the host is at its exact before or after state, serving and routed where it served.

The harness is `scripts/chaos.py` (also `make chaos`, which runs every boundary of every
command and random-time kills); here: a seeded half of rollback's boundaries, a seeded
sample of load and promote boundaries, a `load --promote` killed between its two
transactions, and the named faults of issue 11. A canary killed at its boundaries:
test_never_dark_canary.py.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from scripts.campaign import runtime
from scripts.chaos import ALIAS, LOAD_PROMOTE, Case, ChaosHost, Verdict, recent_transactions, table

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("ANVIL_CHAOS_SEED", "11"))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosHost]:
    h = ChaosHost(tmp_path_factory.mktemp("never-dark"))
    try:
        yield h
    finally:
        h.stop()


def _all_ok(verdicts: list[Verdict]) -> None:
    bad = [f"{v.case.label}: {v.tx_state} -> {v.converged} {v.problems}" for v in verdicts if not v.ok]
    print("\n" + table(verdicts))
    assert bad == [], "\n".join(bad)


class TestKilledAtEveryBoundary:
    def test_a_seeded_half_of_rollbacks_boundaries_converges_to_before_or_after(
        self, host: ChaosHost
    ) -> None:
        # Half of them, seeded (ANVIL_CHAOS_SEED): all 18 cost ~4 minutes of a suite that must
        # stay under 30; `make chaos` kills at every one (docs/NEVER_DARK.md).
        boundaries = host.boundaries("rollback")
        assert len(boundaries) >= 15
        sample = random.Random(f"{SEED}-rollback").sample(boundaries, k=len(boundaries) // 2)
        _all_ok([host.case(Case("rollback", "crash", b)) for b in sample])

    @pytest.mark.parametrize("command", ["load", "promote"])
    def test_a_seeded_sample_of_boundaries_converges(self, host: ChaosHost, command: str) -> None:
        boundaries = host.boundaries(command)
        sample = random.Random(f"{SEED}-{command}").sample(boundaries, k=min(4, len(boundaries)))
        _all_ok([host.case(Case(command, "crash", b)) for b in sample])


class TestKilledWhileWatching:
    def test_a_watched_promote_killed_in_its_watching_phase_converges(self, host: ChaosHost) -> None:
        # From `watching` on, a kill leaves the promote to `recover`, which watches again for
        # what is left (engine/recover.py): the host ends promoted, serving and routed. Two of
        # the phase's boundaries here (entering it, after a sample); `make chaos` kills at all.
        boundaries = host.boundaries("promote-watched")
        chosen = ["promote:state:watching", "promote:watch:watch:sample"]
        assert set(chosen) <= set(boundaries), boundaries
        verdicts = [host.case(Case("promote-watched", "crash", b)) for b in chosen]
        _all_ok(verdicts)
        assert {v.converged for v in verdicts} == {"after"}, verdicts


class TestLoadPromoteKilledBetweenItsTransactions:
    def test_recover_runs_the_promotion_and_the_alias_answers_again_through_the_router(
        self, host: ChaosHost
    ) -> None:
        # Killed right after the load's commit: the promotion never began, no lock row is left.
        assert host.prepare(LOAD_PROMOTE) == "A"
        known = {t["tx_id"] for t in recent_transactions(host.app())}
        crash = host.camp.env | {"ANVIL_CRASH_AT": "load:state:committed"}
        out = host.run(*host.argv(LOAD_PROMOTE), env=crash)
        assert out["_exit"] == -signal.SIGKILL, out
        assert host.phase_of(host.observe()) == "B"  # the candidate unrouted, the incumbent stopped
        client = openai.OpenAI(
            base_url=host.camp.router.url + "/v1", api_key=host.camp.client_token, max_retries=0
        )
        try:
            with pytest.raises(openai.APIStatusError) as dark:
                client.chat.completions.create(
                    model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            assert dark.value.status_code == 503  # dark for clients
            paged = host.run("recheck", "--slot", "primary")
            assert (paged["_exit"], paged["phase"], paged["failed"]) == (5, "qualifying", ["chain"]), paged

            recovered = host.run("recover")
            assert recovered["_exit"] == 0, recovered
            answer = client.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        finally:
            client.close()
        assert answer.model == host.expected("C").routed_model
        assert answer.choices[0].finish_reason is not None
        chain = [t for t in recent_transactions(host.app()) if t["tx_id"] not in known]
        assert [(t["kind"], t["state"]) for t in chain] == [("promote", "committed"), ("load", "committed")]
        assert host.phase_of(host.observe()) == "C"
        assert host.run("recheck", "--slot", "primary")["_exit"] == 0
        assert host.run("recover")["recovered"] == []  # finished once

    @pytest.mark.parametrize(
        ("mode", "boundary", "ends"),
        [
            ("recover-crash", "promote:route-to-candidate:do:intent", "after"),
            ("recover-crash-back", "rollback:release-vram:do:intent", "before"),
        ],
    )
    def test_a_recover_killed_finishing_the_chain_leaves_it_to_the_next(
        self, host: ChaosHost, mode: str, boundary: str, ends: str
    ) -> None:
        # The first recover is SIGKILLed in the chain's promotion before its pivot, or in the
        # bring-back (its promotion refused) with the candidate stopped and the incumbent not
        # yet started: its transactions name the load, so the second recover still finishes
        # the chain (promoted: C; brought back: A) and the third finds nothing.
        verdict = host.case(Case(LOAD_PROMOTE, mode, boundary))
        _all_ok([verdict])
        assert verdict.converged == ends, verdict


class TestRouterRestarted:
    @pytest.mark.parametrize(
        ("command", "boundary"),
        [
            ("promote", "promote:route-to-candidate:do:result"),
            ("promote", "promote:acceptance:do:intent"),
            ("rollback", "rollback:route-back:do:result"),
            ("rollback", "rollback:stop-current:do:intent"),
        ],
    )
    def test_a_router_killed_and_restarted_mid_command_ends_routed(
        self, host: ChaosHost, command: str, boundary: str
    ) -> None:
        verdict = host.case(Case(command, "router", boundary))
        _all_ok([verdict])
        assert verdict.converged == "after", verdict  # the goal check re-applied the route

    @pytest.mark.parametrize("command", ["promote", "rollback"])
    def test_a_router_restarted_just_after_the_commit_is_routed_again_by_the_cron_recheck(
        self, host: ChaosHost, command: str
    ) -> None:
        # The last step's result commits with the end state (engine/runner.py): a restart
        # there is after the commit, past any goal check; `recheck --repair router` closes it.
        verdict = host.case(Case(command, "router-after-commit", f"{command}:state:committed"))
        _all_ok([verdict])
        assert verdict.tx_state == "committed", verdict
        assert verdict.converged == "after", verdict
        # The route really was lost, and the cron's repair (a reconcile transaction) restored it.
        repair = recent_transactions(host.app())[0]
        assert (repair["kind"], repair["state"]) == ("reconcile", "committed"), repair


class TestForeignSharedMemory:
    def test_foreign_files_and_database_segments_never_fail_recheck_or_rollback(
        self, host: ChaosHost
    ) -> None:
        foreign = Path("/dev/shm/anvil-test-foreign-file")
        segment = Path(f"/dev/shm/PostgreSQL.{random.Random(SEED).randint(10**8, 10**9)}")
        holder = None
        try:
            foreign.write_bytes(b"\0" * 4096)
            segment.write_bytes(b"\0" * 8192)
            with segment.open("rb") as fh:  # the child keeps its own descriptor open
                holder = subprocess.Popen(["sleep", "600"], stdin=fh)
            phase = host.prepare("rollback")
            check = host.run("recheck", "--slot", "primary")
            assert check["_exit"] == 0, check.get("failed")
            out = host.run(*host.argv("rollback", phase))
            assert out["state"] == "committed", out.get("reason")
            assert host.run("recheck", "--slot", "primary")["_exit"] == 0
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
            foreign.unlink(missing_ok=True)
            segment.unlink(missing_ok=True)

    def test_the_test_environments_postgresql_server_beside_the_engines_is_no_residue(
        self, host: ChaosHost
    ) -> None:
        """The real server `scripts/testenv` runs on this host throughout (issue 15): its own
        `/dev/shm/PostgreSQL.<n>` segments exist and are mapped by it; recheck passes and a
        rollback commits (its after-snapshot verified) beside them, and they are left alone."""
        pid = os.environ.get("ANVIL_TEST_PG_PID")
        if not pid:
            pytest.fail("no ANVIL_TEST_PG_PID: scripts/testenv starts a PostgreSQL server")
        maps = Path(f"/proc/{pid}/maps").read_text()
        segments = sorted({Path(w) for w in maps.split() if w.startswith("/dev/shm/PostgreSQL.")})
        assert segments, "the server maps its dynamic shared memory from /dev/shm"
        phase = host.prepare("rollback")
        check = host.run("recheck", "--slot", "primary")
        assert check["_exit"] == 0, check.get("failed")
        out = host.run(*host.argv("rollback", phase))
        assert out["state"] == "committed", out.get("reason")
        after = host.run("recheck", "--slot", "primary")
        assert after["_exit"] == 0, after.get("failed")
        assert all(s.exists() for s in segments), "a database's segments are never removed"


class TestDockerdRestarted:
    def test_after_a_daemon_restart_promote_is_refused_and_rollback_restores(self, host: ChaosHost) -> None:
        host.prepare("promote")
        _restart_dockerd()
        out = host.run("promote", "--slot", "primary", "--approved-by", "chaos")
        assert out["_exit"] == 3, out
        restored = host.run("rollback", "--slot", "primary")
        assert restored["state"] == "committed", restored.get("reason")
        assert host.observe().routed_model is not None
        assert host.run("recheck", "--slot", "primary")["_exit"] == 0


class TestRetainedServes:
    """Last in the module: removing a retained serve leaves the host without a way back."""

    def test_a_renamed_retained_incumbent_is_the_same_container(self, host: ChaosHost) -> None:
        host.prepare("rollback")
        inc = host.app().store.current_identity("primary", "rollback")
        rt = runtime()
        try:
            rt._client.api.rename(inc.container_id if inc else "", "renamed-by-an-operator")
        finally:
            rt.close()
        out = host.run("rollback", "--slot", "primary")
        assert out["_exit"] == 0 and out["state"] == "committed", out.get("reason")
        assert host.observe().routed_model is not None

    def test_a_removed_retained_serve_is_refused_and_the_slot_keeps_serving(self, host: ChaosHost) -> None:
        phase = host.prepare("rollback")
        app = host.app()
        target_role = "rollback" if phase == "C" else "candidate"
        target = app.store.current_identity("primary", target_role)
        assert target is not None
        before = host.observe()
        rt = runtime()
        try:
            rt._client.api.remove_container(target.container_id, force=True)
        finally:
            rt.close()
        out = host.run(*host.argv("rollback", phase))
        assert out["_exit"] == 3 and "removed" in out["reason"], out
        assert host.observe() == before


def _restart_dockerd() -> None:
    """Stop the test environment's dockerd (its containers exit: no live-restore) and start it
    again with the same command line; the test environment finds it by the same pid file."""
    pidfile = Path(os.environ["ANVIL_TESTENV_DIR"]) / "docker.pid"
    pid = int(pidfile.read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with (Path(os.environ["ANVIL_TESTENV_DIR"]) / "dockerd.log").open("ab") as log:
        # setsid -f: dockerd is nobody's child here; the test environment stops it by pid file.
        subprocess.run(["setsid", "-f", *(a.decode() for a in argv)], stdout=log, stderr=log, check=True)
    sock = os.environ["DOCKER_HOST"].removeprefix("unix://")
    while time.monotonic() < deadline:
        if _pings(sock):
            return
        time.sleep(0.2)
    raise AssertionError("dockerd did not come back within 60 s")


def _pings(sock: str) -> bool:
    """dockerd answers GET /_ping with 200 on its socket (a plain socket: nothing left open)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(sock)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status = s.recv(64).split(b"\r\n", 1)[0]
        except OSError:
            return False
    return status.split(b" ")[1:2] == [b"200"]
