"""One /dev/shm reading while the host is only observed: guards + before snapshot, and recheck.

Each residue scan walks every process's maps and descriptors; before a transaction's first
mutation (its guards and its before snapshot) and in recheck (assertions and snapshot) the
host is only observed, so one scan answers every question there. Outside that stretch
every reading scans again: the after snapshot sees what the steps changed.
"""

from __future__ import annotations

from typing import Any

import pytest

from anvil_ctl.commands import recheck, transactions
from anvil_ctl.core.model import ResidueFile
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.world import World, one_reading
from anvil_ctl.testing.fakes import FakeSharedMemory
from tests.unit.fakehost import FakeHost

LEFT = {"path": "/dev/shm/nccl-left01", "size": 4096}


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every residue scan of the fake's shared memory, counted."""
    seen: list[int] = []
    real = FakeSharedMemory.residue

    def counted(self: FakeSharedMemory) -> list[ResidueFile]:
        seen.append(1)
        return real(self)

    monkeypatch.setattr(FakeSharedMemory, "residue", counted)
    return seen


def put(host: FakeHost, *entries: dict[str, Any]) -> None:
    with host.world.edit() as w:
        w["residue"] = [dict(e) for e in entries]


class TestOneReading:
    def test_inside_the_stretch_one_scan_answers_and_after_it_a_reading_scans_again(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        world: World = fake_host.context().world()
        shm = world.shm
        assert shm is not None
        with one_reading(world):
            assert world.shm is not None
            assert world.shm.residue() == []
            put(fake_host, LEFT)  # appears meanwhile: the stretch keeps its one reading
            assert world.shm.residue() == []
        assert len(scans) == 1
        assert world.shm is shm
        assert [r.path for r in world.shm.residue()] == [LEFT["path"]]
        assert len(scans) == 2

    def test_a_removal_inside_the_stretch_makes_the_next_reading_scan(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        put(fake_host, LEFT)
        world: World = fake_host.context().world()
        with one_reading(world):
            assert world.shm is not None
            assert [r.path for r in world.shm.residue()] == [LEFT["path"]]
            world.shm.remove_unheld()
            assert world.shm.residue() == []
        assert len(scans) == 2

    def test_recheck_scans_once_for_its_assertion_and_its_snapshot(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        result = recheck.recheck(fake_host.context(), "primary")
        assert result.passed, result.failed
        assert [a["passed"] for a in result.assertions if a["name"] == "shm_residue_zero"] == [True]
        assert len(scans) == 1

    def test_a_load_scans_once_before_its_first_mutation_and_once_after(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        out = transactions.load(
            fake_host.context(), slot="primary", candidate=fake_host.candidate("cand-393k")
        )
        assert out.state == TxState.COMMITTED, out.reason
        assert out.before is not None and out.after is not None
        # The base check and the before snapshot share one scan; the after snapshot has its own.
        assert len(scans) == 2

    def test_residue_left_before_a_load_refuses_it_from_the_one_reading(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        put(fake_host, LEFT)
        out = transactions.load(
            fake_host.context(), slot="primary", candidate=fake_host.candidate("cand-393k")
        )
        assert out.state == TxState.REFUSED
        assert "shm_residue_zero" in out.reason
        assert len(scans) == 1
