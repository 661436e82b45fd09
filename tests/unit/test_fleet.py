"""A fleet of hosts on one state database (issue 15 points 5 and 6), on both backends.

Two fake hosts (`gpu-a`, `gpu-b`: two state directories, two anvil.toml, two machine ids,
two fake worlds) share one database: SQLite (host b names host a's file) or PostgreSQL.

- Each host registers once with its machine id; another machine claiming a name is
  refused (exit 8, both machine ids named) and nothing is written.
- Every history row names its host; what commands read is this host's; `--host` and
  `--all-hosts` widen the audit listings; `fleet status` lists both; the serving history
  answers "which container served primary on host B at time T".
- The host lock is per host: a mutation on each host at once, both commit; a second
  mutator of one host is refused (exit 3) naming the owner's host and pid.
- `db copy --to URL`: a host's whole SQLite history into another database, verified there,
  and refused (exit 9, nothing written) the second time.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from anvil_ctl.commands import audit, lifecycle, transactions
from anvil_ctl.commands.audit import HostScope
from anvil_ctl.core.errors import BadInput, LockHeld
from anvil_ctl.core.states import ExitCode
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.persistence import hosts, projection
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.store import Store
from scripts.campaign import verified_decision
from tests.unit.fakehost import FakeHost, make_fake_host

REPO = Path(__file__).resolve().parents[2]
SLOT = "primary"
MACHINE_A, MACHINE_B = "a" * 32, "b" * 32


def _fleet(root: Path, state_db: str | None) -> tuple[FakeHost, FakeHost]:
    a = make_fake_host(root / "a", state_db=state_db, host="gpu-a", machine_id=MACHINE_A)
    shared = state_db or f"sqlite:///{(root / 'a' / 'state' / 'anvil.db').resolve()}"
    b = make_fake_host(root / "b", state_db=shared, host="gpu-b", machine_id=MACHINE_B)
    return a, b


@pytest.fixture
def fleet(tmp_path: Path, state_db: str | None) -> tuple[FakeHost, FakeHost]:
    return _fleet(tmp_path, state_db)


def _anvilctl(
    host: FakeHost, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args],
        cwd=REPO,
        env={**host.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _verified(host: FakeHost, n: int) -> None:
    """A verified decision for the loaded candidate (what a passing `qualify` records)."""
    app = host.app()
    verified_decision(app.store, SLOT, f"dec-{host.settings.state_dir.parent.name}-{n}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _head_and_hosts(host: FakeHost) -> tuple[str, int]:
    store = host.app().store
    return str(store.head()), len(hosts.all_hosts(store))


class TestHostIdentity:
    def test_each_host_is_registered_once_with_its_machine_and_its_rows_name_it(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, _b = fleet
        store = a.app().store
        assert [(h.id, h.name, h.machine_id) for h in hosts.all_hosts(store)] == [
            (1, "gpu-a", MACHINE_A),
            (2, "gpu-b", MACHINE_B),
        ]
        with store.read() as s:
            adopts = s.execute(text("SELECT host_id FROM transactions WHERE kind = 'adopt' ORDER BY host_id"))
            assert [r[0] for r in adopts] == [1, 2]

    def test_another_machine_claiming_a_host_name_is_refused_naming_both_and_writes_nothing(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, b = fleet
        before = _head_and_hosts(a)
        # host a's config and state, but host b's machine: a second machine claiming gpu-a
        r = _anvilctl(
            a, "audit", "transactions", env={"ANVIL_MACHINE_ID_FILE": str(b.settings.machine_id_file)}
        )
        assert r.returncode == ExitCode.HOST_CLAIMED == 8, r.stderr
        assert "'gpu-a'" in r.stderr and MACHINE_A in r.stderr and MACHINE_B in r.stderr
        mutate = _anvilctl(a, "recover", env={"ANVIL_MACHINE_ID_FILE": str(b.settings.machine_id_file)})
        assert mutate.returncode == 8, mutate.stderr
        assert _head_and_hosts(a) == before

    def test_a_host_name_that_is_not_a_short_name_is_bad_input_naming_the_field(
        self, fleet: tuple[FakeHost, FakeHost], tmp_path: Path
    ) -> None:
        a, _b = fleet
        before = _head_and_hosts(a)
        cfg = tmp_path / "bad.toml"
        cfg.write_text(a.settings.config.read_text().replace('host = "gpu-a"', '[host]\nname = "GPU A!"'))
        r = _anvilctl(a, "--config", str(cfg), "audit", "transactions")
        assert r.returncode == ExitCode.BAD_INPUT, r.stderr
        assert "host" in r.stderr and "GPU A!" in r.stderr
        assert _head_and_hosts(a) == before


class TestHostScoping:
    def test_what_a_host_reads_is_its_own_and_the_audit_listings_widen_on_request(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, b = fleet
        out = transactions.load(a.app(), slot=SLOT, candidate=a.candidate())
        assert out.state.value == "committed", out.reason
        # a's candidate is a's: b (same slot name, same database) has none
        assert a.app().store.current_identity(SLOT, "candidate") is not None
        assert b.app().store.current_identity(SLOT, "candidate") is None
        assert b.app().store.unresolved() == []
        assert [t["kind"] for t in audit.transactions(b.app())] == ["adopt"]
        assert {t["host"] for t in audit.transactions(b.app())} == {"gpu-b"}
        everyone = audit.transactions(b.app(), scope=HostScope(all_hosts=True))
        assert sorted((t["host"], t["kind"]) for t in everyone) == [
            ("gpu-a", "adopt"),
            ("gpu-a", "load"),
            ("gpu-b", "adopt"),
        ]
        assert [t["kind"] for t in audit.transactions(b.app(), scope=HostScope(host="gpu-a"))] == [
            "load",
            "adopt",
        ]
        # a transaction of another host is shown only when asked for
        with pytest.raises(BadInput):
            audit.show(b.app(), str(out.tx_id))
        shown = audit.show(b.app(), str(out.tx_id), HostScope(host="gpu-a"))
        assert shown["host"] == "gpu-a"
        with pytest.raises(BadInput) as unknown:
            audit.transactions(b.app(), scope=HostScope(host="gpu-z"))
        assert unknown.value.data["field"] == "--host"
        with a.app().store.read() as s:
            assert projection.compare(s) == []
        report = audit.verify(b.app(), full=True, scope=HostScope(all_hosts=True))
        assert report["ok"], report["problems"]
        assert [h["host"] for h in report.get("hosts", [])] == ["gpu-a", "gpu-b"]

    def test_fleet_status_lists_every_host_with_its_incumbents_rechecks_and_open_transactions(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, b = fleet
        from anvil_ctl.commands import recheck

        recheck.recheck(b.app(), SLOT)
        r = _anvilctl(a, "fleet", "status", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)["hosts"]
        assert [(h["host"], h["this_host"]) for h in got] == [("gpu-a", True), ("gpu-b", False)]
        assert [s["incumbent"] for s in got[0]["slots"]] == [a.incumbent_id]
        assert [s["incumbent"] for s in got[1]["slots"]] == [b.incumbent_id]
        assert got[0]["last_recheck"] is None and got[1]["last_recheck"]["slot"] == SLOT
        assert got[0]["open_transactions"] == [] == got[1]["open_transactions"]

    def test_the_serving_history_answers_which_container_served_a_slot_on_a_host_at_a_time(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, b = fleet
        before_promote = _now()
        transactions.load(a.app(), slot=SLOT, candidate=a.candidate())
        _verified(a, 1)
        promoted = lifecycle.promote(a.app(), slot=SLOT, approved_by="operator")
        assert promoted.state.value == "committed", promoted.reason
        after_promote = _now()
        candidate = a.app().store.current_identity(SLOT, "incumbent")
        assert candidate is not None and candidate.container_id != a.incumbent_id

        def served(at: str, *scope: str) -> list[tuple[str, str]]:
            r = _anvilctl(b, "audit", "served", "--slot", SLOT, "--at", at, *scope, "--json")
            assert r.returncode == 0, r.stderr
            return [(row["host"], row["container_id"]) for row in json.loads(r.stdout)]

        assert served(before_promote, "--host", "gpu-a") == [("gpu-a", a.incumbent_id)]
        assert served(after_promote, "--host", "gpu-a") == [("gpu-a", candidate.container_id)]
        assert served(after_promote) == [("gpu-b", b.incumbent_id)]  # default: this host (b)
        assert served(after_promote, "--all-hosts") == [
            ("gpu-a", candidate.container_id),
            ("gpu-b", b.incumbent_id),
        ]
        assert served("2000-01-01", "--all-hosts") == []


def _spawn_load(host: FakeHost, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.unit.child_load", str(host.root), name],
        cwd=REPO,
        env={**host.env(), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _started_intent(host: FakeHost) -> bool:
    app = host.app()
    txs = audit.transactions(app, kind="load")
    if not txs:
        return False
    return any(
        s["step"] == "start-candidate" and s["event"] == "intent"
        for s in audit.show(app, txs[0]["tx_id"])["steps"]
    )


class TestPerHostLock:
    def test_two_hosts_mutate_at_once_and_a_second_mutator_of_one_host_is_refused(
        self, fleet: tuple[FakeHost, FakeHost]
    ) -> None:
        a, b = fleet
        a.world.set_hang("start")  # a's load holds a's lock, mid-transaction
        holder = _spawn_load(a, "cand-a")
        _wait_for(lambda: _started_intent(a))
        # meanwhile b's own load runs to its end
        out = transactions.load(b.app(), slot=SLOT, candidate=b.candidate(name="cand-b"))
        assert out.state.value == "committed", out.reason
        rival = _spawn_load(a, "rival-a")
        _, err = rival.communicate(timeout=60)
        assert rival.returncode == ExitCode.REFUSED, err
        assert "another mutator holds this host" in err and f"pid {holder.pid} on gpu-a" in err
        a.world.set_hang(None)
        stdout, err = holder.communicate(timeout=60)
        assert holder.returncode == 0, err
        assert stdout.strip() == "committed"
        for host in (a, b):
            assert [t["state"] for t in audit.transactions(host.app(), kind="load")] == ["committed"]
            assert _anvilctl(host, "lock", "status", "--json").stdout.strip() == "[]"

    def test_on_postgresql_one_host_through_two_state_directories_is_still_one_mutator(
        self, fleet: tuple[FakeHost, FakeHost], backend: str, tmp_path: Path
    ) -> None:
        a, _b = fleet
        if backend != "postgresql":
            pytest.skip("the advisory lock is PostgreSQL's; an SQLite database is one directory's")
        # gpu-a again (same machine), from a second state directory: its lock file is another
        twin = make_fake_host(
            tmp_path / "twin", state_db=a.settings.state_db, host="gpu-a", machine_id=MACHINE_A
        )
        a.world.set_hang("start")
        holder = _spawn_load(a, "cand-a")
        _wait_for(lambda: _started_intent(a))
        rival = _spawn_load(twin, "twin-a")
        _, err = rival.communicate(timeout=60)
        assert rival.returncode == ExitCode.REFUSED, err
        assert f"pid {holder.pid} on gpu-a" in err
        a.world.set_hang(None)
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 0, err

    def test_on_postgresql_the_hosts_advisory_lock_excludes_before_any_lock_row_exists(
        self, fleet: tuple[FakeHost, FakeHost], backend: str, tmp_path: Path
    ) -> None:
        """Two processes of one host that both hold their own lock file and neither has
        written its row yet (checking arguments): only the advisory lock tells them apart."""
        a, b = fleet
        if backend != "postgresql":
            pytest.skip("the advisory lock is PostgreSQL's")
        twin = make_fake_host(
            tmp_path / "twin", state_db=a.settings.state_db, host="gpu-a", machine_id=MACHINE_A
        )
        app = a.app()
        first = HostLock(app.store, a.settings.lock_path, app.owner, "promote")
        first.acquire(claim=False)
        try:
            twin_app = twin.app()
            rival = HostLock(twin_app.store, twin.settings.lock_path, twin_app.owner, "load")
            with pytest.raises(LockHeld) as held:
                rival.acquire()
            assert "a mutator of host gpu-a holds its lock in the state database" in str(held.value)
            b_app = b.app()  # another host's lock is another key
            other = HostLock(b_app.store, b.settings.lock_path, b_app.owner, "load")
            other.acquire()
            other.release()
        finally:
            first.release()
        rival.acquire()  # given back: the twin may go now
        rival.release()


class TestDbCopy:
    @pytest.mark.parametrize("target", ["sqlite", "postgresql"])
    def test_a_hosts_sqlite_history_is_copied_verified_there_and_refused_a_second_time(
        self, tmp_path: Path, target: str, request: pytest.FixtureRequest
    ) -> None:
        a = make_fake_host(tmp_path / "a", host="gpu-a", machine_id=MACHINE_A)
        transactions.load(a.app(), slot=SLOT, candidate=a.candidate())
        _verified(a, 1)
        assert lifecycle.promote(a.app(), slot=SLOT, approved_by="operator").state.value == "committed"
        assert lifecycle.rollback(a.app(), slot=SLOT).state.value == "committed"
        if target == "postgresql":
            make: Callable[..., str] = request.getfixturevalue("pg_database")
            url = make(migrated=False)  # an empty database: the copy migrates it first
            # another host already lives there: the copy's keys must not collide with its rows
            make_fake_host(tmp_path / "b", state_db=url, host="gpu-b", machine_id=MACHINE_B)
        else:
            url = f"sqlite:///{tmp_path / 'target.db'}"
        db = sqlite3.connect(a.settings.state_dir / "anvil.db")
        source_counts = {
            t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in (
                "transactions",
                "transaction_states",
                "step_events",
                "identities",
                "decisions",
                "approvals",
            )
        }
        db.close()

        r = _anvilctl(a, "db", "copy", "--to", url, "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["host"] == "gpu-a" and out["target_verified"]["ok"]
        assert {t: out["rows"][t] for t in source_counts} == source_counts
        assert out["entries"] > 0 and out["not_copied"]["audit_checkpoints"] >= 1

        # this host, now on the target: verify there, its status and history are the source's
        on_target = {"ANVIL_STATE_DB": url}
        verify = _anvilctl(a, "audit", "verify", "--full", "--all-hosts", "--json", env=on_target)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        status = json.loads(_anvilctl(a, "fleet", "status", "--json", env=on_target).stdout)["hosts"]
        mine = next(h for h in status if h["host"] == "gpu-a")
        source_incumbent = a.app().store.current_identity(SLOT, "incumbent")
        assert source_incumbent is not None
        assert [s["incumbent"] for s in mine["slots"]] == [source_incumbent.container_id]
        listed = json.loads(_anvilctl(a, "audit", "transactions", "--json", env=on_target).stdout)
        assert sorted(t["kind"] for t in listed) == ["adopt", "load", "promote", "rollback"]

        engine = make_engine(url)
        try:
            head = Store(engine).head()
            again = _anvilctl(a, "db", "copy", "--to", url)
            assert again.returncode == ExitCode.TARGET_HOLDS_HOST == 9, again.stderr
            assert "already holds host 'gpu-a'" in again.stderr
            assert Store(engine).head() == head  # nothing written
        finally:
            engine.dispose()

    def test_a_source_that_does_not_verify_is_not_copied(self, tmp_path: Path) -> None:
        a = make_fake_host(tmp_path / "a", host="gpu-a", machine_id=MACHINE_A)
        (a.settings.state_dir / "anvil.db.head").unlink()  # a cut tail can no longer be told
        target = tmp_path / "target.db"
        r = _anvilctl(a, "db", "copy", "--to", f"sqlite:///{target}")
        assert r.returncode == ExitCode.DRIFT, r.stderr
        assert "does not verify" in r.stderr and "nothing was copied" in r.stderr
        assert not target.exists()

    def test_a_host_without_history_has_nothing_to_copy(self, tmp_path: Path) -> None:
        a = make_fake_host(tmp_path / "a", host="gpu-a", machine_id=MACHINE_A)
        cfg = tmp_path / "other.toml"
        cfg.write_text(a.settings.config.read_text().replace('host = "gpu-a"', 'host = "gpu-new"'))
        target = tmp_path / "target.db"
        r = _anvilctl(a, "--config", str(cfg), "db", "copy", "--to", f"sqlite:///{target}")
        assert r.returncode == ExitCode.BAD_INPUT and "gpu-new" in r.stderr, r.stderr
        assert not target.exists()

    def test_a_target_that_is_not_a_database_url_is_bad_input_naming_the_field(
        self, fake_host: FakeHost
    ) -> None:
        r = _anvilctl(fake_host, "db", "copy", "--to", "mysql://nope")
        assert r.returncode == ExitCode.BAD_INPUT and "--to" in r.stderr
