"""NvmlProbe against a fake pynvml module built from the real one's errors and codes."""

from __future__ import annotations

import ctypes.util
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from anvil_ctl.adapters.nvml import NvmlProbe, NvmlUnavailable, mib
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.model import GpuProcess
from anvil_ctl.core.ports import GpuProbe

GIB = 2**30
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H200"
    total: int = 150_754_820_096  # an H200's 143,771 MiB
    used: int = 0
    reserved: int = 561 * 2**20
    procs: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """The subset of pynvml the probe calls, with pynvml's real error classes and codes."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, devices: list[FakeDevice], **failures: int) -> None:
        self.devices = devices
        self.failures = failures  # call name -> NVML return code to raise
        self.inits = 0
        self.shutdowns = 0
        for name in dir(pynvml):
            if name.startswith("NVML_ERROR_"):
                setattr(self, name, getattr(pynvml, name))

    def _maybe_fail(self, call: str) -> None:
        if call in self.failures:
            raise pynvml.NVMLError(self.failures[call])

    def nvmlInit(self) -> None:
        self._maybe_fail("init")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def nvmlDeviceGetUUID(self, dev: FakeDevice) -> bytes:
        return dev.uuid.encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, dev: FakeDevice) -> str:
        return dev.name

    def nvmlDeviceGetMemoryInfo(self, dev: FakeDevice, version: int | None = None) -> Any:
        if version is not None:
            self._maybe_fail("memory_v2")
            free = dev.total - dev.reserved - dev.used
            return SimpleNamespace(total=dev.total, used=dev.used, free=free, reserved=dev.reserved)
        # v1: the driver's reservation counts as used
        used = dev.used + dev.reserved
        return SimpleNamespace(total=dev.total, used=used, free=dev.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, dev: FakeDevice) -> list[Any]:
        self._maybe_fail("processes")
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in dev.procs]


@pytest.fixture
def two_cards() -> FakeNvml:
    return FakeNvml(
        [
            FakeDevice(UUID_A, used=4 * GIB + 123, procs=[(4242, 4 * GIB), (17, None)]),
            FakeDevice(UUID_B),
        ]
    )


class TestMib:
    def test_floors_bytes_to_whole_mib(self) -> None:
        assert mib(2**20 - 1) == 0
        assert mib(2**20) == 1
        assert mib(3 * 2**20 + 2**19) == 3


class TestNvmlProbe:
    def test_it_satisfies_the_gpu_probe_port(self, two_cards: FakeNvml) -> None:
        assert isinstance(NvmlProbe(two_cards), GpuProbe)

    def test_gpus_reports_uuid_name_index_and_mib_of_every_card(self, two_cards: FakeNvml) -> None:
        a, b = NvmlProbe(two_cards).gpus()
        assert (a.uuid, a.name, a.index) == (UUID_A, "NVIDIA H200", 0)
        assert (b.uuid, b.index) == (UUID_B, 1)
        assert a.total_mib == 143_771
        assert a.used_mib == 4096  # 123 extra bytes floor away
        assert a.free_mib == 143_771 - 561 - 4096 - 1  # free bytes are not a whole MiB

    def test_memory_excludes_the_driver_reservation_like_nvidia_smi(self, two_cards: FakeNvml) -> None:
        b = NvmlProbe(two_cards).gpus()[1]
        assert b.used_mib == 0
        assert b.free_mib == 143_771 - 561

    def test_falls_back_to_v1_memory_when_the_driver_lacks_v2(self) -> None:
        nvml = FakeNvml([FakeDevice(UUID_A)], memory_v2=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        (a,) = NvmlProbe(nvml).gpus()
        assert a.used_mib == 561

    def test_compute_processes_carry_pid_and_used_mib(self, two_cards: FakeNvml) -> None:
        a = NvmlProbe(two_cards).gpus()[0]
        assert a.processes == (GpuProcess(pid=17, used_mib=0), GpuProcess(pid=4242, used_mib=4096))

    def test_unsupported_process_accounting_gives_no_processes(self) -> None:
        nvml = FakeNvml([FakeDevice(UUID_A)], processes=pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert NvmlProbe(nvml).gpus()[0].processes == ()

    def test_driver_version(self, two_cards: FakeNvml) -> None:
        assert NvmlProbe(two_cards).driver_version() == "570.124.06"

    def test_every_call_shuts_nvml_down_again(self, two_cards: FakeNvml) -> None:
        probe = NvmlProbe(two_cards)
        probe.gpus()
        probe.driver_version()
        assert (two_cards.inits, two_cards.shutdowns) == (2, 2)

    @pytest.mark.parametrize(
        "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
    )
    def test_a_host_without_driver_raises_a_clear_unavailable_error(self, code: int) -> None:
        with pytest.raises(NvmlUnavailable, match="NVIDIA driver installed") as info:
            NvmlProbe(FakeNvml([], init=code)).gpus()
        assert isinstance(info.value, AdapterError)
        assert isinstance(info.value.__cause__, pynvml.NVMLError)
        assert info.value.data["nvml_code"] == code

    def test_a_host_without_gpus_raises_unavailable_after_shutting_down(self) -> None:
        nvml = FakeNvml([])
        with pytest.raises(NvmlUnavailable, match="no GPU"):
            NvmlProbe(nvml).gpus()
        assert nvml.shutdowns == 1

    def test_a_timeout_is_transient(self) -> None:
        with pytest.raises(TransientError):
            NvmlProbe(FakeNvml([FakeDevice(UUID_A)], processes=pynvml.NVML_ERROR_TIMEOUT)).gpus()

    def test_other_nvml_errors_are_adapter_errors_naming_the_card(self) -> None:
        nvml = FakeNvml([FakeDevice(UUID_A)], processes=pynvml.NVML_ERROR_GPU_IS_LOST)
        with pytest.raises(AdapterError, match=f"processes of {UUID_A}") as info:
            NvmlProbe(nvml).gpus()
        assert not isinstance(info.value, NvmlUnavailable | TransientError)
        assert nvml.shutdowns == 1

    @pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has NVML")
    def test_the_real_pynvml_on_a_host_without_nvml_raises_unavailable(self) -> None:
        with pytest.raises(NvmlUnavailable, match="ANVIL_GPU=simulated"):
            NvmlProbe().gpus()
