"""Ownership rules: exclusive vs split, unknown processes, the serve being replaced."""

from __future__ import annotations

import pytest

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import GpuProcess
from anvil_ctl.gpu.ownership import GpuOwner, check_start, unknown_processes
from tests.unit.fake_gpus import reading

UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
TP2 = GpuOwner("c0ffee" * 10 + "abcd", "tx-incumbent", "exclusive", slot="primary")
LEFT = GpuOwner("aaaa" * 16, "tx-left", "split", slot="left")


class TestCheckStartExclusive:
    owners = {"compute-a": TP2, "compute-b": TP2}

    def test_any_other_gpu_start_is_refused_naming_the_owner(self) -> None:
        refusal = check_start(self.owners, ["compute-a"], "split")
        assert refusal is not None
        assert refusal.owner == TP2
        assert "c0ffeec0ffee" in str(refusal)
        assert "tx-incumbent" in str(refusal)
        assert "exclusively" in str(refusal)

    def test_a_start_on_a_role_the_exclusive_owner_did_not_name_is_refused_too(self) -> None:
        owners = {"compute-a": GpuOwner(TP2.container_id, "tx-incumbent", "exclusive")}
        refusal = check_start(owners, ["compute-b"], "split")
        assert refusal is not None
        assert refusal.role == "compute-a"

    def test_replacing_the_exclusive_owner_frees_its_roles(self) -> None:
        assert (
            check_start(self.owners, ["compute-a", "compute-b"], "exclusive", replacing={TP2.container_id})
            is None
        )

    def test_an_exclusive_start_needs_every_role_free(self) -> None:
        refusal = check_start({"compute-b": LEFT}, ["compute-a"], "exclusive")
        assert refusal is not None
        assert refusal.owner == LEFT
        assert "every GPU role free" in refusal.reason

    def test_a_start_without_gpus_is_not_judged_by_split_owners(self) -> None:
        assert check_start({"compute-b": LEFT}, [], "exclusive") is None


class TestCheckStartSplit:
    def test_a_free_role_may_be_taken(self) -> None:
        assert check_start({"compute-a": LEFT}, ["compute-b"], "split") is None

    def test_an_owned_role_is_refused_naming_its_owner(self) -> None:
        refusal = check_start({"compute-a": LEFT}, ["compute-a"], "split")
        assert refusal is not None
        assert refusal.as_dict()["owner"] == {
            "container_id": LEFT.container_id,
            "transaction_id": "tx-left",
            "mode": "split",
            "slot": "left",
        }
        assert "slot left" in str(refusal)

    def test_the_serve_being_replaced_does_not_compete(self) -> None:
        assert check_start({"compute-a": LEFT}, ["compute-a"], "split", replacing=[LEFT.container_id]) is None

    def test_an_unknown_process_on_a_requested_card_refuses_the_start(self) -> None:
        unknown = {"compute-a": [GpuProcess(pid=4242, used_mib=1500)]}
        refusal = check_start({}, ["compute-a"], "split", unknown=unknown)
        assert refusal is not None
        assert refusal.owner is None
        assert "pid 4242 (1500 MiB)" in str(refusal)

    def test_an_unknown_process_on_another_card_does_not(self) -> None:
        unknown = {"compute-b": [GpuProcess(pid=4242, used_mib=1500)]}
        assert check_start({}, ["compute-a"], "split", unknown=unknown) is None

    def test_an_unknown_mode_is_bad_input(self) -> None:
        with pytest.raises(BadInput):
            check_start({}, ["compute-a"], "shared")  # type: ignore[arg-type]


class TestUnknownProcesses:
    def test_processes_of_known_pids_are_left_out(self) -> None:
        readings = [
            reading(UA, processes=[GpuProcess(10, 100), GpuProcess(11, 200)]),
            reading(UB, processes=[GpuProcess(10, 100)], index=1),
        ]
        found = unknown_processes(readings, {"compute-a": UA.upper(), "compute-b": UB}, {10})
        assert found == {"compute-a": (GpuProcess(11, 200),)}
