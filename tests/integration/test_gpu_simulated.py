"""Simulated GPUs end to end on real Docker: stub engines declare VRAM, the GPU logic judges it.

Replays the seeds' 393,216-token profile on a simulated RTX PRO 6000 pair:
95,786 MiB held per card after the workload leaves 2,101 MiB free, short of
the 3,072 MiB reserve (policy-infeasible) until a waiver for the pair sets it
to 0. Also the ownership refusal for a process no owner accounts for, and the
VRAM-release gate passing after a stop and timing out while a serve still runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from anvil_ctl.adapters.simulated_gpu import SimulatedGpuProbe
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.waiver import Waiver
from anvil_ctl.gpu.ownership import check_start, unknown_processes
from anvil_ctl.gpu.vram import VramReserveGate, wait_for_vram_release
from anvil_ctl.gpu.waiver_policy import Decision, outcome_of, reclassify

UA = "GPU-5eed0000-0000-4000-8000-00000000000a"
UB = "GPU-5eed0000-0000-4000-8000-00000000000b"
CAPACITY = 97_887
ROLES = {
    "compute-a": GpuRole(uuid=UA, capacity_mib=CAPACITY, name="simulated RTX PRO 6000"),
    "compute-b": GpuRole(uuid=UB, capacity_mib=CAPACITY, name="simulated RTX PRO 6000"),
}
UUIDS = {name: role.uuid for name, role in ROLES.items()}


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def probe(runtime: Any) -> SimulatedGpuProbe:
    return SimulatedGpuProbe(ROLES, runtime)


@pytest.fixture
def tp2_stub(stub_container: Callable[..., Any], free_port: Callable[[], int]) -> Callable[..., Any]:
    """A stub serving on both simulated cards, holding `idle` MiB, `loaded` after one request."""

    def make(idle: int, loaded: int) -> tuple[Any, int]:
        port = free_port()
        info = stub_container(
            served_model="glm-393k",
            port=port,
            gpu_uuids=[UA, UB],
            labels={"io.anvil.port": str(port)},
            extra_args=[
                "--vram-idle-mib",
                str(idle),
                "--vram-loaded-mib",
                str(loaded),
                "--vram-after-requests",
                "1",
            ],
        )
        return info, port

    return make


def one_request(port: int) -> None:
    response = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={
            "model": "glm-393k",
            "messages": [{"role": "user", "content": "Reply with exactly: ok"}],
        },
        timeout=10,
    )
    assert response.status_code == 200


class TestReserveOnSimulatedGpus:
    def test_the_393k_profile_is_policy_infeasible_until_the_pair_is_waived(
        self, probe: SimulatedGpuProbe, tp2_stub: Callable[..., Any]
    ) -> None:
        _, port = tp2_stub(idle=94_536, loaded=95_786)
        idle = {r.uuid: r.free_mib for r in probe.gpus()}
        assert idle == {UA: 3_351, UB: 3_351}  # the seeds' idle reserve

        one_request(port)
        gate = VramReserveGate(dict.fromkeys(UUIDS, 3072), UUIDS)
        result = gate(probe.gpus())
        assert not result.passed
        assert [c.free_mib for c in result.cards] == [2_101, 2_101]

        outcome, reasons = outcome_of([result])
        decision = Decision("dec-1", outcome, "id" * 32, "ev-1", reasons=reasons)
        assert decision.outcome == "policy-infeasible"
        now = datetime.now(UTC)
        waiver = Waiver(
            id="w-pair",
            policy="vram-reserve",
            value=0,
            approved_by="operator",
            reason="model-only GPU pair",
            created_at=now,
            roles=frozenset(UUIDS),
        )
        new = reclassify(decision, [result], [waiver], now)
        assert (new.outcome, new.reclassifies, new.evidence_id) == ("verified", "dec-1", "ev-1")
        assert decision.outcome == "policy-infeasible"


class TestOwnershipOnSimulatedGpus:
    def test_a_stub_no_owner_accounts_for_refuses_a_start_on_its_cards(
        self, probe: SimulatedGpuProbe, tp2_stub: Callable[..., Any]
    ) -> None:
        info, _ = tp2_stub(idle=1_000, loaded=1_000)
        readings = probe.gpus()
        assert info.pid and any(p.pid == info.pid for p in readings[0].processes)

        strangers = unknown_processes(readings, UUIDS, known_pids=set())
        refusal = check_start({}, ["compute-a"], "split", unknown=strangers)
        assert refusal is not None
        assert f"pid {info.pid} (1000 MiB)" in str(refusal)

        known = unknown_processes(readings, UUIDS, known_pids={info.pid})
        assert check_start({}, ["compute-a"], "split", unknown=known) is None


class TestReleaseOnSimulatedGpus:
    def test_stopping_the_incumbent_releases_its_vram_within_the_deadline(
        self, runtime: Any, probe: SimulatedGpuProbe, tp2_stub: Callable[..., Any]
    ) -> None:
        info, _ = tp2_stub(idle=90_000, loaded=90_000)
        runtime.stop(info.id, timeout_s=5)
        result = wait_for_vram_release(
            probe, RealClock(), UUIDS, need_mib=80_000, reserve_mib=3072, deadline_s=10, poll_s=0.2
        )
        assert result["released"] is True
        assert result["after"][UA]["used_mib"] == 0

    def test_a_serve_that_keeps_running_times_the_gate_out_with_its_readings(
        self, probe: SimulatedGpuProbe, tp2_stub: Callable[..., Any]
    ) -> None:
        tp2_stub(idle=90_000, loaded=90_000)
        with pytest.raises(StepFailed, match="not released within") as info:
            wait_for_vram_release(
                probe,
                RealClock(),
                UUIDS,
                need_mib=80_000,
                reserve_mib=3072,
                deadline_s=1,
                poll_s=0.2,
            )
        assert info.value.data["before"][UA]["used_mib"] == 90_000
        assert info.value.data["after"][UB]["free_mib"] == CAPACITY - 90_000
        assert info.value.data["polls"] >= 2
