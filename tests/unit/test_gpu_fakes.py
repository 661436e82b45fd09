"""The GPU fakes: FakeGpuProbe, ManualClock, and SimulatedGpuProbe over a fake runtime."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from anvil_ctl.adapters.simulated_gpu import SimulatedGpuProbe
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.errors import AdapterError
from anvil_ctl.core.model import ContainerInfo, GpuProcess
from anvil_ctl.core.ports import Clock, GpuProbe
from tests.unit.fake_gpus import FakeGpuProbe, ManualClock, reading

UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
ROLES = {
    "compute-a": GpuRole(uuid=UA, capacity_mib=97_887),
    "compute-b": GpuRole(uuid=UB, capacity_mib=97_887, name="RTX PRO 6000"),
}


def container(
    cid: str, port: int | None, status: str = "running", pid: int = 100, **labels: str
) -> ContainerInfo:
    all_labels = {"io.anvil.managed": "true", **labels}
    if port is not None:
        all_labels["io.anvil.port"] = str(port)
    return ContainerInfo(
        id=cid,
        name=cid,
        image_id="sha256:x",
        image_ref="stub",
        status=status,  # type: ignore[arg-type]
        labels=all_labels,
        pid=pid,
    )


class ListOnlyRuntime:
    def __init__(self, containers: list[ContainerInfo]) -> None:
        self.containers = containers
        self.asked: list[dict[str, str] | None] = []

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        self.asked.append(labels)
        return self.containers


class TestManualClock:
    def test_sleep_advances_time_without_waiting(self) -> None:
        clock = ManualClock(10)
        assert isinstance(clock, Clock)
        clock.sleep(2.5)
        assert (clock.now(), clock.sleeps) == (12.5, [2.5])


class TestFakeGpuProbe:
    def test_scheduled_changes_happen_at_their_poll(self) -> None:
        probe = FakeGpuProbe([reading(UA, 100, 90)])
        assert isinstance(probe, GpuProbe)
        probe.after_polls(2, UA, 10, [GpuProcess(7, 10)])
        assert probe.gpus()[0].free_mib == 10
        second = probe.gpus()[0]
        assert (second.used_mib, second.free_mib, second.processes) == (
            10,
            90,
            (GpuProcess(7, 10),),
        )

    def test_an_injected_error_is_raised(self) -> None:
        probe = FakeGpuProbe([reading(UA)])
        probe.error = AdapterError("gone")
        with pytest.raises(AdapterError, match="gone"):
            probe.gpus()


class TestSimulatedGpuProbe:
    def test_inventory_is_the_host_config_roles(self) -> None:
        probe = SimulatedGpuProbe(ROLES, ListOnlyRuntime([]), http_get=lambda url: {"gpus": {}})
        a, b = probe.gpus()
        assert (a.uuid, a.total_mib, a.used_mib, a.free_mib, a.index) == (UA, 97_887, 0, 97_887, 0)
        assert (b.uuid, b.name, b.index) == (UB, "RTX PRO 6000", 1)
        assert probe.driver_version() == "simulated"

    def test_used_memory_is_the_sum_over_running_managed_stubs(self) -> None:
        answers = {
            "http://127.0.0.1:8001/anvil/sim/vram": {"gpus": {UA: 95_786, UB: 95_786}},
            "http://127.0.0.1:8002/anvil/sim/vram": {"gpus": {UA.upper(): 1000}},
        }
        runtime = ListOnlyRuntime(
            [
                container("c1", 8001, pid=11),
                container("c2", 8002, pid=22),
                container("c3", 8003, status="exited", pid=0),
            ]
        )
        asked: list[str] = []

        def get(url: str) -> Any:
            asked.append(url)
            return answers[url]

        a, b = SimulatedGpuProbe(ROLES, runtime, http_get=get).gpus()
        assert runtime.asked == [{"io.anvil.managed": "true"}]
        assert sorted(asked) == sorted(answers)  # the exited container is not asked
        assert (a.used_mib, a.free_mib) == (96_786, 1_101)
        assert a.processes == (GpuProcess(11, 95_786), GpuProcess(22, 1000))
        assert (b.used_mib, b.free_mib) == (95_786, 2_101)

    def test_used_memory_is_capped_at_capacity(self) -> None:
        runtime = ListOnlyRuntime([container("c1", 8001)])
        (a, _) = SimulatedGpuProbe(ROLES, runtime, http_get=lambda u: {"gpus": {UA: 10**6}}).gpus()
        assert (a.used_mib, a.free_mib) == (97_887, 0)

    def test_the_binding_label_wins_over_the_port_label(self) -> None:
        runtime = ListOnlyRuntime([container("c1", 8001, **{"io.anvil.binding": "127.0.0.2:9000"})])
        asked: list[str] = []
        SimulatedGpuProbe(ROLES, runtime, http_get=lambda u: asked.append(u) or {"gpus": {}}).gpus()
        assert asked == ["http://127.0.0.2:9000/anvil/sim/vram"]

    def test_a_stub_not_answering_yet_holds_nothing(self) -> None:
        def refuse(url: str) -> Any:
            raise httpx.ConnectError("refused")

        runtime = ListOnlyRuntime([container("c1", 8001)])
        assert SimulatedGpuProbe(ROLES, runtime, http_get=refuse).gpus()[0].used_mib == 0

    def test_a_wrong_answer_is_an_adapter_error(self) -> None:
        runtime = ListOnlyRuntime([container("c1", 8001)])
        with pytest.raises(AdapterError, match="expected"):
            SimulatedGpuProbe(ROLES, runtime, http_get=lambda u: {"vram": 1}).gpus()

    def test_an_http_error_is_an_adapter_error(self) -> None:
        def fail(url: str) -> Any:
            raise httpx.HTTPStatusError(
                "500", request=httpx.Request("GET", url), response=httpx.Response(500)
            )

        runtime = ListOnlyRuntime([container("c1", 8001)])
        with pytest.raises(AdapterError, match="failed"):
            SimulatedGpuProbe(ROLES, runtime, http_get=fail).gpus()

    def test_a_gpu_container_without_a_port_label_is_an_adapter_error(self) -> None:
        runtime = ListOnlyRuntime([container("c1", None, **{"io.anvil.gpus": UA})])
        with pytest.raises(AdapterError, match=r"no io\.anvil\.binding or io\.anvil\.port"):
            SimulatedGpuProbe(ROLES, runtime, http_get=lambda u: {"gpus": {}}).gpus()

    def test_a_container_without_gpus_or_port_is_skipped(self) -> None:
        runtime = ListOnlyRuntime([container("c1", None)])
        assert SimulatedGpuProbe(ROLES, runtime, http_get=lambda u: {"gpus": {}}).gpus()[0].used_mib == 0
