"""The VRAM-release gate: waits on the Clock until free >= need + reserve, or fails."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import transactions
from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import VramNeed
from anvil_ctl.core.ports import Clock, GpuProbe
from anvil_ctl.core.states import TxState
from anvil_ctl.gpu.vram import wait_for_vram_release
from tests.unit.fake_gpus import FakeGpuProbe, ManualClock, reading

UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
ROLES = {"compute-a": UA, "compute-b": UB}


@pytest.fixture
def probe() -> FakeGpuProbe:
    # The stopped incumbent still holds 90,000 MiB on each card.
    return FakeGpuProbe([reading(UA, 97_887, 90_000), reading(UB, 97_887, 90_000, index=1)])


class TestWaitForVramRelease:
    def test_returns_once_every_card_is_freed_with_both_readings(self, probe: FakeGpuProbe) -> None:
        probe.after_polls(3, UA, 500)
        probe.after_polls(4, UB, 500)
        clock = ManualClock()
        result = wait_for_vram_release(
            probe, clock, ROLES, need_mib=80_000, reserve_mib=3072, deadline_s=60, poll_s=2
        )
        assert result["released"] is True
        assert result["polls"] == 4
        assert result["waited_s"] == 6
        assert clock.sleeps == [2, 2, 2]
        assert result["before"][UA]["free_mib"] == 7_887
        assert result["after"][UB]["free_mib"] == 97_387
        assert result["required_free_mib"] == {UA: 83_072, UB: 83_072}

    def test_free_exactly_need_plus_reserve_is_enough(self, probe: FakeGpuProbe) -> None:
        probe.set_used(UA, 97_887 - 83_072)
        probe.set_used(UB, 97_887 - 83_072)
        result = wait_for_vram_release(
            probe, ManualClock(), ROLES, need_mib=80_000, reserve_mib=3072, deadline_s=60
        )
        assert result["polls"] == 1

    def test_per_role_need_and_reserve(self, probe: FakeGpuProbe) -> None:
        probe.set_used(UA, 0)
        result = wait_for_vram_release(
            probe,
            ManualClock(),
            {"compute-a": UA},
            need_mib={"compute-a": 90_000},
            reserve_mib={"compute-a": 0},
            deadline_s=1,
        )
        assert result["required_free_mib"] == {UA: 90_000}

    def test_the_deadline_raises_step_failed_with_both_readings(self, probe: FakeGpuProbe) -> None:
        probe.after_polls(2, UA, 0)  # one card frees, the other never does
        clock = ManualClock()
        with pytest.raises(StepFailed, match="not released within 10 s: compute-b free 7887") as info:
            wait_for_vram_release(
                probe, clock, ROLES, need_mib=80_000, reserve_mib=3072, deadline_s=10, poll_s=1
            )
        data = info.value.data
        assert data["released"] is False
        assert data["before"][UA]["used_mib"] == 90_000
        assert data["after"][UA]["used_mib"] == 0
        assert data["after"][UB]["used_mib"] == 90_000
        assert data["waited_s"] == 10
        assert probe.polls == 11

    def test_a_requirement_above_capacity_fails_at_once(self, probe: FakeGpuProbe) -> None:
        clock = ManualClock()
        with pytest.raises(StepFailed, match="can never succeed"):
            wait_for_vram_release(probe, clock, ROLES, need_mib=97_000, reserve_mib=3072, deadline_s=60)
        assert clock.sleeps == []

    def test_a_card_the_probe_does_not_see_fails_at_once(self, probe: FakeGpuProbe) -> None:
        gone = "GPU-cccccccc-0000-0000-0000-000000000003"
        with pytest.raises(StepFailed, match="not visible") as info:
            wait_for_vram_release(
                probe, ManualClock(), {"compute-c": gone}, need_mib=1, reserve_mib=0, deadline_s=60
            )
        assert info.value.data["after"] == {gone: None}


def vram_release_step(
    probe: GpuProbe,
    clock: Clock,
    uuids: Mapping[str, str],
    *,
    reserve_mib: Mapping[str, int],
    deadline_s: float,
    poll_s: float = 1.0,
    default_need_mib: int = 0,
) -> Callable[[VramNeed], JSONObject]:
    """A VRAM-release gate with fixed reserves (no waivers), as a world's `vram_release`.

    `uuids` and `reserve_mib` cover every host role (role -> UUID, role -> the
    reserve in force); the need's roles select the cards, and its `need_mib` (per
    card; `default_need_mib` where it is 0) is the need.
    """

    def gate(need: VramNeed) -> JSONObject:
        roles = need.roles
        if not roles:
            return {"skipped": "the candidate uses no GPU role"}
        unknown = sorted(set(roles) - set(uuids))
        if unknown:
            raise StepFailed(f"VRAM release: roles not in the host config: {unknown}")
        return wait_for_vram_release(
            probe,
            clock,
            {r: uuids[r] for r in roles},
            need_mib=need.need_mib or default_need_mib,
            reserve_mib={r: reserve_mib[r] for r in roles},
            deadline_s=deadline_s,
            poll_s=poll_s,
        )

    return gate


class TestVramReleaseInLoad:
    """The gate as the `load` transaction's release-vram step, on the engine's fake host."""

    def _load_with_gate(self, fake_host: Any, probe: FakeGpuProbe, monkeypatch: pytest.MonkeyPatch) -> Any:
        original = App.world
        step = vram_release_step(
            probe,
            ManualClock(),
            ROLES,
            reserve_mib={"compute-a": 3072, "compute-b": 3072},
            deadline_s=30,
            poll_s=5,
            default_need_mib=80_000,
        )

        def world_with_gate(self: App) -> Any:
            world = original(self)
            world.vram_release = step
            return world

        monkeypatch.setattr(App, "world", world_with_gate)
        return transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())

    def test_a_release_timeout_compensates_and_brings_the_incumbent_back(
        self, fake_host: Any, probe: FakeGpuProbe, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        probe.set_used(UA, 90_000)  # never released: 7,887 MiB free < 80,000 + 3,072
        out = self._load_with_gate(fake_host, probe, monkeypatch)
        assert out.state == TxState.COMPENSATED, out.reason
        assert "release-vram" in out.reason
        assert "not released within 30 s" in out.reason
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        assert [c for c in world["containers"].values() if c["name"] == "cand"] == []
        assert world["router"]["tiers"]["primary-local"]["state"] == "ready"

    def test_a_released_card_lets_the_load_commit_with_both_readings(
        self, fake_host: Any, probe: FakeGpuProbe, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        probe.after_polls(3, UA, 500)
        probe.after_polls(3, UB, 500)
        out = self._load_with_gate(fake_host, probe, monkeypatch)
        assert out.state == TxState.COMMITTED, out.reason
        readings = out.results["release-vram"]
        assert readings["before"][UA]["used_mib"] == 90_000
        assert readings["after"][UA]["used_mib"] == 500
        assert readings["polls"] == 3
