"""The Docker adapter's GPU path without an NVIDIA runtime (device nodes, driver libraries),
its choice between that and Docker's GPU request, and inspect reading the GPUs back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.adapters import nvidia_devices
from anvil_ctl.adapters.docker_fingerprint import inspect_fingerprint_fields
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.core.errors import AdapterError
from anvil_ctl.core.model import ContainerSpec, Mount

UUID = "GPU-7d35cb71-54bc-05dd-6543-82a7e26a127b"
OTHER = "GPU-00000000-1111-2222-3333-444444444444"

# As an H200 host's driver lists it (/proc/driver/nvidia/gpus/0000:00:06.0/information).
INFORMATION = f"""Model: \t\t NVIDIA H200
IRQ:   \t\t 41
GPU UUID: \t {UUID}
Video BIOS: \t 96.00.a5.00.1a
Bus Type: \t PCIe
Device Minor: \t 0
GPU Excluded:\t No
"""

# `ldconfig -p` of that host (abridged): the driver under /usr/local/nvidia/lib64 and /lib.
LDCONFIG = """\t7 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /lib/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1
\tlibnvidia-ml.so (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so
\tlibnvidia-gpucomp.so.580.159.04 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04
\tlibnvidia-encode.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-encode.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1
\tlibcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1
"""

DRIVER_LIBS = [
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1",
]


@pytest.fixture
def proc_driver(tmp_path: Path) -> Path:
    gpu = tmp_path / "0000:00:06.0"
    gpu.mkdir()
    (gpu / "information").write_text(INFORMATION)
    return tmp_path


class TestDriverListing:
    def test_a_gpu_is_found_by_uuid_with_its_minor_number(self, proc_driver: Path) -> None:
        nodes = nvidia_devices.gpu_nodes(proc_driver)
        assert nodes == {UUID.lower(): nvidia_devices.GpuNode(uuid=UUID, minor=0)}
        assert nodes[UUID.lower()].path == "/dev/nvidia0"

    def test_no_driver_lists_no_gpu(self, tmp_path: Path) -> None:
        assert nvidia_devices.gpu_nodes(tmp_path / "absent") == {}

    def test_device_nodes_are_the_control_nodes_that_exist_and_the_gpus_own(self, proc_driver: Path) -> None:
        nodes = nvidia_devices.gpu_nodes(proc_driver)
        got = nvidia_devices.device_nodes([UUID.upper()], nodes, exists=["/dev/nvidiactl", "/dev/nvidia-uvm"])
        assert got == [
            "/dev/nvidiactl:/dev/nvidiactl:rwm",
            "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
            "/dev/nvidia0:/dev/nvidia0:rwm",
        ]

    def test_a_gpu_the_driver_does_not_list_is_an_error_naming_it(self, proc_driver: Path) -> None:
        with pytest.raises(AdapterError, match=OTHER):
            nvidia_devices.device_nodes([OTHER], nvidia_devices.gpu_nodes(proc_driver), exists=[])

    def test_driver_libraries_are_the_loaders_first_choice_of_each_compute_soname(self) -> None:
        # not the 32-bit copy, not the unversioned development link, not the video encoder
        assert nvidia_devices.driver_libraries(LDCONFIG) == DRIVER_LIBS

    def test_a_mount_of_the_same_host_directory_covers_its_libraries(self) -> None:
        assert nvidia_devices.library_mounts(DRIVER_LIBS, [("/usr", "/usr")]) == []
        assert (
            nvidia_devices.library_mounts(
                DRIVER_LIBS, [("/srv/usr", "/usr"), ("/usr/local/nv", "/usr/local/nv")]
            )
            == DRIVER_LIBS
        )


class FakeContainers:
    def __init__(self) -> None:
        self.created: dict[str, Any] = {}

    def create(self, **kwargs: Any) -> Any:
        self.created = kwargs

        class Created:
            id = "c" * 64

        return Created()


class FakeClient:
    def __init__(self, runtimes: dict[str, Any]) -> None:
        self.containers = FakeContainers()
        self.runtimes = runtimes
        self.info_calls = 0

    def info(self) -> dict[str, Any]:
        self.info_calls += 1
        return {"Runtimes": self.runtimes}

    def close(self) -> None:
        pass


def spec(**changes: Any) -> ContainerSpec:
    base: dict[str, Any] = {
        "name": "cand",
        "image": "sha256:" + "a" * 64,
        "mounts": (Mount(source="/usr", target="/usr", read_only=True),),
        "gpu_uuids": (UUID,),
    }
    return ContainerSpec(**(base | changes))


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, proc_driver: Path) -> None:
    """This machine seen as the GPU host: its driver's listing, its loader cache, its nodes."""
    nodes = nvidia_devices.gpu_nodes(proc_driver)
    monkeypatch.setattr(nvidia_devices, "gpu_nodes", lambda: nodes)
    monkeypatch.setattr(nvidia_devices, "read_ldconfig_cache", lambda: LDCONFIG)
    real = nvidia_devices.device_nodes
    monkeypatch.setattr(
        nvidia_devices,
        "device_nodes",
        lambda uuids, nodes: real(uuids, nodes, exists=nvidia_devices.CONTROL_NODES),
    )


@pytest.mark.usefixtures("host")
class TestCreate:
    def test_auto_without_an_nvidia_runtime_gives_device_nodes_and_no_gpu_request(self) -> None:
        client = FakeClient({"runc": {}})
        runtime = DockerRuntime(client, gpu_mode="auto")  # type: ignore[arg-type]
        runtime.create(spec())
        made = client.containers.created
        assert runtime.gpu_mode == "devices"
        assert made["devices"] == [
            "/dev/nvidiactl:/dev/nvidiactl:rwm",
            "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
            "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm",
            "/dev/nvidia0:/dev/nvidia0:rwm",
        ]
        assert "device_requests" not in made
        # the host's /usr is mounted: the driver's libraries are seen where the host has them
        assert [m["Target"] for m in made["mounts"]] == ["/usr"]
        assert made["labels"]["io.anvil.gpus"] == UUID

    def test_auto_with_an_nvidia_runtime_uses_dockers_gpu_request(self) -> None:
        client = FakeClient({"nvidia": {"path": "nvidia-container-runtime"}, "runc": {}})
        runtime = DockerRuntime(client, gpu_mode="auto")  # type: ignore[arg-type]
        runtime.create(spec())
        runtime.create(spec(name="second"))
        made = client.containers.created
        assert runtime.gpu_mode == "nvidia"
        assert client.info_calls == 1  # decided once
        (request,) = made["device_requests"]
        assert request["DeviceIDs"] == [UUID] and request["Capabilities"] == [["gpu"]]
        assert "devices" not in made

    def test_devices_mounts_the_driver_libraries_a_container_would_not_see(self) -> None:
        client = FakeClient({})
        runtime = DockerRuntime(client, gpu_mode="devices")  # type: ignore[arg-type]
        runtime.create(spec(mounts=()))
        made = client.containers.created
        assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in made["mounts"]] == [
            (lib, lib, True) for lib in DRIVER_LIBS
        ]
        assert made["labels"]["io.anvil.gpu.libraries"] == ",".join(DRIVER_LIBS)
        assert client.info_calls == 0

    def test_a_cpu_engine_gets_no_device_and_asks_nothing(self) -> None:
        client = FakeClient({})
        runtime = DockerRuntime(client, gpu_mode="auto")  # type: ignore[arg-type]
        runtime.create(spec(gpu_uuids=()))
        assert "devices" not in client.containers.created
        assert client.info_calls == 0 and runtime.gpu_mode == "auto"


class TestInspect:
    def test_a_devices_container_reads_back_its_gpus_and_the_specs_own_mounts(self) -> None:
        lib = DRIVER_LIBS[0]
        attrs = {
            "Config": {
                "Image": "sha256:" + "a" * 64,
                "Labels": {"io.anvil.gpus": UUID, "io.anvil.gpu.libraries": lib},
            },
            "HostConfig": {
                "Devices": [
                    {"PathOnHost": "/dev/nvidiactl", "PathInContainer": "/dev/nvidiactl"},
                    {"PathOnHost": "/dev/nvidia0", "PathInContainer": "/dev/nvidia0"},
                ],
                "Mounts": [
                    {"Source": "/usr", "Target": "/usr", "ReadOnly": True},
                    {"Source": lib, "Target": lib, "ReadOnly": True},
                ],
            },
        }
        fields, gpus = inspect_fingerprint_fields(attrs, None)
        assert gpus == [UUID]
        want = spec(mounts=(Mount(source="/usr", target="/usr", read_only=True),)).fingerprint_fields()
        assert fields["mounts"] == want["mounts"]
        assert fields["gpu_uuids"] == want["gpu_uuids"]

    def test_the_label_alone_names_no_gpu(self) -> None:
        attrs = {"Config": {"Labels": {"io.anvil.gpus": UUID}}, "HostConfig": {}}
        assert inspect_fingerprint_fields(attrs, None)[1] == []
