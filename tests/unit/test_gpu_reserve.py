"""The reserve policy gate: free MiB per card after a workload against the reserve in force."""

from __future__ import annotations

import pytest

from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.model import GpuReading
from anvil_ctl.gpu.vram import VramReserveGate
from tests.unit.fake_gpus import reading

UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
UUIDS = {"compute-a": UA, "compute-b": UB}
TOTAL = 97_887  # an RTX PRO 6000 Blackwell's MiB, as in the seeds


def after_workload(free_a: int, free_b: int) -> list[GpuReading]:
    return [
        reading(UA, TOTAL, TOTAL - free_a, index=0),
        reading(UB, TOTAL, TOTAL - free_b, index=1),
    ]


class TestVramReserveGate:
    gate = VramReserveGate({"compute-a": 3072, "compute-b": 3072}, UUIDS)

    def test_free_equal_to_the_reserve_passes(self) -> None:
        result = self.gate(after_workload(3072, 3072))
        assert result.passed
        assert result.margin_mib == 0

    def test_one_mib_below_the_reserve_fails(self) -> None:
        result = self.gate(after_workload(3072, 3071))
        assert not result.passed
        assert result.margin_mib == -1
        assert [c.passed for c in result.cards] == [True, False]

    def test_the_seeds_393k_profile_is_short_of_the_reserve(self) -> None:
        result = self.gate(after_workload(2101, 2101))
        assert not result.passed
        assert result.threshold_mib == {"compute-a": 3072, "compute-b": 3072}
        assert result.margin_mib == -971

    def test_reserves_are_per_role(self) -> None:
        gate = VramReserveGate({"compute-a": 0, "compute-b": 3072}, UUIDS)
        assert not gate(after_workload(10, 2000)).passed
        assert gate(after_workload(10, 3072)).passed

    def test_a_card_the_probe_did_not_report_fails_unobserved(self) -> None:
        result = self.gate(after_workload(5000, 5000)[:1])
        assert not result.passed
        missing = result.cards[1]
        assert (missing.role, missing.free_mib, missing.margin_mib) == ("compute-b", None, None)
        assert result.margin_mib is None

    def test_uuids_match_in_any_case(self) -> None:
        gate = VramReserveGate({"compute-a": 10}, {"compute-a": UA.upper()})
        assert gate([reading(UA, 100, 50)]).passed

    def test_the_evidence_holds_every_reading_and_round_trips(self) -> None:
        result = self.gate(after_workload(2101, 2543))
        evidence = result.evidence()
        assert evidence["passed"] is False
        assert evidence["cards"][0] == {
            "role": "compute-a",
            "uuid": UA,
            "threshold_mib": 3072,
            "free_mib": 2101,
            "used_mib": TOTAL - 2101,
            "total_mib": TOTAL,
            "margin_mib": -971,
            "passed": False,
        }

    def test_a_reserve_for_a_role_without_uuid_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="no GPU UUID"):
            VramReserveGate({"compute-c": 3072}, UUIDS)

    def test_a_negative_reserve_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="negative"):
            VramReserveGate({"compute-a": -1}, UUIDS)
