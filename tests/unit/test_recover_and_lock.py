"""Crash recovery and the one-mutator lock, with real processes against the shipped fakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anvil_ctl.commands import audit
from anvil_ctl.core.errors import BadInput, LockHeld
from anvil_ctl.engine.lock import HostLock, held_locks
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


def _spawn_load(host: FakeHost, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.unit.child_load", str(host.root), name],
        cwd=REPO,
        env={**host.env(), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _started_intent(host: FakeHost) -> bool:
    app = host.app()
    txs = audit.transactions(app, kind="load")
    if not txs:
        return False
    steps = audit.show(app, txs[0]["tx_id"])["steps"]
    return any(s["step"] == "start-candidate" and s["event"] == "intent" for s in steps)


def _anvilctl(host: FakeHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args],
        cwd=REPO,
        env=host.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


class TestRecoverAfterSigkill:
    def test_a_transaction_killed_between_intent_and_result_is_compensated_twice_safely(
        self, fake_host_on: FakeHost
    ) -> None:
        fake_host_on.world.set_hang("start")  # start acts, then blocks before the result row
        child = _spawn_load(fake_host_on, "killed-cand")
        _wait_for(lambda: _started_intent(fake_host_on))
        _wait_for(
            lambda: any(
                c["name"] == "killed-cand" and c["status"] == "running"
                for c in fake_host_on.world.read()["containers"].values()
            )
        )
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        app = fake_host_on.app()
        tx = audit.transactions(app, kind="load")[0]
        assert tx["state"] == "running"  # the dead owner left it mid-step
        steps = audit.show(app, tx["tx_id"])["steps"]
        assert ("start-candidate", "intent") in [(s["step"], s["event"]) for s in steps]
        assert ("start-candidate", "result") not in [(s["step"], s["event"]) for s in steps]
        assert [h.pid for h in held_locks(app.store)] == [child.pid]
        # A new mutator is refused while the dead owner's lock row stands.
        refused = subprocess.run(
            [sys.executable, "-m", "tests.unit.child_load", str(fake_host_on.root), "other"],
            cwd=REPO,
            env={**fake_host_on.env(), "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 3 and "stale lock" in refused.stderr

        fake_host_on.world.set_hang(None)
        first = _anvilctl(fake_host_on, "recover", "--json")
        assert first.returncode == 0, first.stderr
        report = json.loads(first.stdout)
        assert [r["tx_id"] for r in report["recovered"]] == [tx["tx_id"]]
        assert report["recovered"][0]["state"] == "compensated"
        assert report["recovered"][0]["undone"] == [
            "start-candidate",
            "stop-incumbent",
            "drain-tier",
        ]
        assert [lk["pid"] for lk in report["released_locks"]] == [child.pid]

        world = fake_host_on.world.read()
        assert world["containers"][fake_host_on.incumbent_id]["status"] == "running"
        killed = [c for c in world["containers"].values() if c["name"] == "killed-cand"]
        assert [c["status"] for c in killed] == ["exited"]
        assert world["router"]["tiers"]["primary-local"]["state"] == "ready"
        states = [s["state"] for s in audit.show(app, tx["tx_id"])["states"]]
        assert states == ["planned", "running", "interrupted", "compensating", "compensated"]

        second = _anvilctl(fake_host_on, "recover", "--json")
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout) == {"recovered": [], "skipped": [], "released_locks": []}
        assert fake_host_on.world.read() == world


class TestOneMutatorPerHost:
    def test_two_racing_processes_one_proceeds_the_other_exits_3_naming_the_owner(
        self, fake_host_on: FakeHost
    ) -> None:
        fake_host_on.world.set_hang("start")
        a = _spawn_load(fake_host_on, "racer-a")
        b = _spawn_load(fake_host_on, "racer-b")
        # Exactly one reaches its start step; the other is refused at once.
        _wait_for(lambda: _started_intent(fake_host_on))
        procs = {a.pid: a, b.pid: b}
        _wait_for(lambda: any(p.poll() is not None for p in procs.values()))
        loser = next(p for p in procs.values() if p.poll() is not None)
        winner = next(p for p in procs.values() if p is not loser)
        _, err = loser.communicate()
        assert loser.returncode == 3
        assert f"pid {winner.pid}" in err and "another mutator holds this host" in err
        fake_host_on.world.set_hang(None)
        out, err = winner.communicate(timeout=60)
        assert winner.returncode == 0, err
        assert out.strip() == "committed"
        status = _anvilctl(fake_host_on, "lock", "status", "--json")
        assert json.loads(status.stdout) == []


class TestTheLockRowIsClaimedOnlyWhenTheTransactionBegins:
    """A command that checks its arguments under the OS lock writes its row only once they
    passed: exit 2 in between leaves no row, and a rival meanwhile is told who waits."""

    def _lock(self, host: FakeHost, command: str) -> HostLock:
        app = host.app()
        return HostLock(app.store, host.settings.lock_path, app.owner, command)

    def test_an_unclaimed_lock_writes_no_row_and_a_rival_is_refused_naming_the_pid(
        self, fake_host: FakeHost
    ) -> None:
        rows_before = audit.transactions(fake_host.app(), limit=1000)
        first = self._lock(fake_host, "promote")
        first.acquire(claim=False)
        try:
            assert held_locks(fake_host.app().store) == []
            with pytest.raises(
                LockHeld, match=rf"pid {os.getpid()} holds the lock file .* \(checking its arguments\)"
            ):
                self._lock(fake_host, "rollback").acquire()
            first.claim()
            assert [h.command for h in held_locks(fake_host.app().store)] == ["promote"]
        finally:
            first.release()
        assert held_locks(fake_host.app().store) == []
        assert audit.transactions(fake_host.app(), limit=1000) == rows_before

    def test_bad_input_found_under_the_lock_writes_nothing(self, fake_host: FakeHost) -> None:
        from anvil_ctl.commands import lifecycle

        before = self._audit_rows(fake_host)
        with pytest.raises(BadInput, match="no candidate"):
            lifecycle.promote(fake_host.app(), slot="primary", approved_by="alice")
        with pytest.raises(BadInput, match="no revision, transaction or recorded identity"):
            lifecycle.rollback(fake_host.app(), slot="primary", to="abcdefabcdef")
        assert self._audit_rows(fake_host) == before

    def _audit_rows(self, host: FakeHost) -> int:
        import sqlite3

        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        try:
            return int(con.execute("SELECT count(*) FROM audit_journal").fetchone()[0])
        finally:
            con.close()


class TestTheLockRowCommitsWithTheTransaction:
    """The lock row is written in the database transaction of the transaction's first row and
    released in the one of its end state (one commit each instead of two)."""

    def _entries(self, host: FakeHost) -> list[tuple[str, set[str]]]:
        """Each audit entry: its event, and the tables of the rows it covers."""
        from sqlalchemy import select

        from anvil_ctl.persistence.models import AuditEntry

        with host.app().store.read() as s:
            rows = s.execute(select(AuditEntry.event, AuditEntry.rows_json).order_by(AuditEntry.id)).all()
        return [(event, {str(r[0]) for r in json.loads(covered)}) for event, covered in rows]

    def _one_entry_covers(self, host: FakeHost, *tables: str) -> bool:
        return any(set(tables) <= covered for _event, covered in self._entries(host))

    def test_a_load_claims_its_row_with_its_first_row_and_releases_it_with_its_end_state(
        self, fake_host: FakeHost
    ) -> None:
        from anvil_ctl.commands.transactions import load

        before = len(self._entries(fake_host))
        outcome = load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert outcome.state.value == "committed"
        assert held_locks(fake_host.app().store) == []
        written = [covered for _event, covered in self._entries(fake_host)[before:]]
        assert {"locks", "transactions"} <= written[0]
        assert {"lock_releases", "transaction_states"} <= written[-1]
        assert not [c for c in written if "locks" in c or "lock_releases" in c][1:-1]

    def test_the_end_state_entry_names_the_transaction_once(self, fake_host: FakeHost) -> None:
        """The release is the lock's transaction's, as its acquisition: the entry that commits
        it with the end state names that transaction, and its events do not each repeat it."""
        from sqlalchemy import select

        from anvil_ctl.commands.transactions import load
        from anvil_ctl.persistence.models import AuditEntry

        outcome = load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert outcome.state.value == "committed"
        with fake_host.app().store.read() as s:
            last = s.execute(
                select(AuditEntry.tx_id, AuditEntry.payload_json, AuditEntry.rows_json)
                .order_by(AuditEntry.id.desc())
                .limit(1)
            ).one()
        assert {str(r[0]) for r in json.loads(last.rows_json)} >= {"lock_releases", "transaction_states"}
        assert last.tx_id == outcome.tx_id
        assert '"tx_id"' not in last.payload_json, last.payload_json

    def test_a_refusal_releases_the_row_in_the_commit_of_its_refused_state(self, fake_host: FakeHost) -> None:
        from anvil_ctl.commands import lifecycle

        # Nothing to restore: the incumbent serves and no rollback identity is recorded.
        outcome = lifecycle.rollback(fake_host.app(), slot="primary")
        assert outcome.state.value == "refused", outcome.reason
        assert held_locks(fake_host.app().store) == []
        assert self._one_entry_covers(fake_host, "lock_releases", "transaction_states")

    def test_a_crash_before_the_end_state_leaves_the_row_for_recover(self, fake_host: FakeHost) -> None:
        child = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "rollback", "--slot", "primary"],
            cwd=REPO,
            env={**fake_host.env(), "ANVIL_CRASH_AT": "rollback:state:planned"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
        stale = held_locks(fake_host.app().store, fake_host.app().owner)
        assert [(h.command, h.alive) for h in stale] == [("rollback", False)]
        assert self._one_entry_covers(fake_host, "locks", "transactions")

    def test_a_rollbacks_recorded_restored_diff_commits_with_its_end_state(self, fake_host: FakeHost) -> None:
        from sqlalchemy import select

        from anvil_ctl.commands import lifecycle
        from anvil_ctl.commands.transactions import load
        from anvil_ctl.persistence.models import AuditEntry

        assert (
            load(fake_host.app(), slot="primary", candidate=fake_host.candidate()).state.value == "committed"
        )
        out = lifecycle.rollback(fake_host.app(), slot="primary")
        assert out.state.value == "committed", out.reason
        with fake_host.app().store.read() as s:
            last = s.execute(
                select(AuditEntry.rows_json).order_by(AuditEntry.id.desc()).limit(1)
            ).scalar_one()
        tables = [str(r[0]) for r in json.loads(last)]
        # the after snapshot's diff and the recorded-restored one, the committed state, the release
        assert tables.count("snapshot_diffs") == 2, tables
        assert {"transaction_states", "lock_releases"} <= set(tables)
        labels = [d["label"] for d in audit.diff(fake_host.app(), out.tx_id or "")]
        assert sorted(labels) == ["before-after", "recorded-restored"]
