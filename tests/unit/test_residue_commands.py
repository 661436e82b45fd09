"""Residue means ours, through the commands: recheck, snapshots and unload on the fake host.

The fake's residue entries follow the real adapter's rule at the port: `"ours":
false` is another program's file (never reported, never removed), `"pids"` are
processes of managed containers holding a file of ours (in use, not residue yet).
"""

from __future__ import annotations

from typing import Any

from anvil_ctl.commands import recheck, serves, transactions
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.observe import observe
from anvil_ctl.testing.runtime import FakeSharedMemory
from tests.unit.fakehost import FakeHost

PG = {"path": "/dev/shm/PostgreSQL.1234", "size": 1 << 20, "ours": False}
FOREIGN = {"path": "/dev/shm/foreign-4k", "size": 4096, "ours": False}
LIVE = {"path": "/dev/shm/nccl-live01", "size": 4096, "pids": [700]}
LEFT = {"path": "/dev/shm/nccl-left01", "size": 4096}


def put(host: FakeHost, *entries: dict[str, Any]) -> None:
    with host.world.edit() as w:
        w["residue"] = [dict(e) for e in entries]


def residue_assertion(host: FakeHost) -> dict[str, Any]:
    result = recheck.recheck(host.app(), "primary")
    (found,) = [a for a in result.assertions if a["name"] == "shm_residue_zero"]
    return found


class TestRecheckResidue:
    def test_another_programs_files_never_fail_the_residue_assertion(self, fake_host: FakeHost) -> None:
        put(fake_host, PG, FOREIGN)
        result = recheck.recheck(fake_host.app(), "primary")
        assert result.passed and result.exit_code == 0
        assert residue_assertion(fake_host) == {"name": "shm_residue_zero", "passed": True, "observed": []}

    def test_files_a_running_engine_holds_are_in_use_not_residue(self, fake_host: FakeHost) -> None:
        put(fake_host, LIVE)
        assert residue_assertion(fake_host)["passed"] is True

    def test_a_file_a_managed_engine_left_fails_it_until_removed(self, fake_host: FakeHost) -> None:
        put(fake_host, PG, LEFT)
        assert residue_assertion(fake_host) == {
            "name": "shm_residue_zero",
            "passed": False,
            "observed": [LEFT["path"]],
        }
        put(fake_host, PG)
        assert residue_assertion(fake_host)["passed"] is True


class TestSnapshotResidue:
    def test_the_snapshot_names_only_our_residue(self, fake_host: FakeHost) -> None:
        put(fake_host, PG, FOREIGN, LIVE, LEFT)
        world = fake_host.app().world()
        assert observe(world, ["primary"]).body["shm_residue"] == [LEFT["path"]]

    def test_another_programs_files_do_not_change_the_snapshot(self, fake_host: FakeHost) -> None:
        world = fake_host.app().world()
        before = observe(world, ["primary"]).sha256
        put(fake_host, PG, FOREIGN, LIVE)
        assert observe(world, ["primary"]).sha256 == before


class TestUnloadRemovesOnlyOurResidue:
    def test_remove_residue_deletes_our_unheld_files_keeps_held_ones_and_never_touches_others(
        self, fake_host: FakeHost
    ) -> None:
        load = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert load.state == TxState.COMMITTED, load.reason
        put(fake_host, PG, FOREIGN, LIVE, LEFT)
        out = serves.unload(
            fake_host.app(),
            load.results["start-candidate"]["container_id"],
            yes=True,
            remove_residue=True,
        )
        assert out.state == TxState.COMMITTED, out.reason
        assert out.results["record-residue"] == {
            "shm_residue": [{"path": LEFT["path"], "size": 4096, "pids": []}]
        }
        assert out.results["remove-residue"] == {
            "removed": [LEFT["path"]],
            "kept": [{"path": LIVE["path"], "why": "mapped or open by pids [700]"}],
        }
        assert [e["path"] for e in fake_host.world.read()["residue"]] == [
            PG["path"],
            FOREIGN["path"],
            LIVE["path"],
        ]


class TestFakeSharedMemory:
    def test_reports_and_removes_by_the_real_rule(self, fake_host: FakeHost) -> None:
        put(fake_host, PG, LIVE, LEFT)
        fake = FakeSharedMemory(fake_host.world)
        assert [r.path for r in fake.residue()] == [LEFT["path"]]
        removal = fake.remove_unheld()
        assert removal.removed == (LEFT["path"],)
        assert removal.kept == ((LIVE["path"], "mapped or open by pids [700]"),)
        assert fake.residue() == []
