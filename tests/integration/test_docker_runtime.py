"""DockerRuntime on the real Docker Engine of scripts/testenv (inside the loopback-only netns)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from anvil_ctl.adapters import nvidia_devices
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.core.errors import AdapterError, BadInput, NotFound
from anvil_ctl.core.model import ContainerSpec, config_fingerprint
from tests.integration.conftest import StubFactory, stub_url

pytestmark = pytest.mark.integration
GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-66666666-7777-8888-9999-000000000000"
SpecFactory = Callable[..., ContainerSpec]


@pytest.fixture
def created(runtime: DockerRuntime) -> Any:
    """Create containers from specs; remove them (by ID) at teardown."""
    ids: list[str] = []

    def create(spec: ContainerSpec, rt: DockerRuntime | None = None) -> str:
        container_id = (rt or runtime).create(spec)
        ids.append(container_id)
        return container_id

    yield create
    for container_id in ids:
        with contextlib.suppress(NotFound):
            runtime.remove(container_id, force=True)


class TestHermeticEnvironment:
    def test_only_loopback_exists_in_the_namespace(self) -> None:
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
        names = [line.split(":")[1].strip() for line in links.stdout.splitlines()]
        assert names == ["lo"]

    def test_a_connect_to_a_non_loopback_address_fails(self) -> None:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect(("192.0.2.1", 80))

    def test_a_host_network_container_cannot_reach_off_the_machine_either(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        probe = (
            "import socket,sys\ns=socket.socket();s.settimeout(2)\n"
            "try:\n s.connect(('192.0.2.1',80))\nexcept OSError:\n sys.exit(7)\nsys.exit(0)"
        )
        spec = dataclasses.replace(stub_spec(), command=("/usr/bin/python3", "-c", probe))
        container_id = created(spec)
        runtime.start(container_id)
        deadline = time.monotonic() + 10
        while runtime.inspect(container_id).running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert runtime.inspect(container_id).exit_code == 7


class TestCreateAndInspect:
    def test_the_fingerprint_from_inspect_equals_the_specs(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any, stub_image_id: str
    ) -> None:
        spec = stub_spec(env={"SECRET_LIKE": "value-1"}, gpu_uuids=[GPU_A, GPU_B])
        container_id = created(spec)
        info = runtime.inspect(container_id)
        assert info.fingerprint == config_fingerprint(spec.fingerprint_fields())
        assert (info.id, info.status, info.image_id) == (container_id, "created", stub_image_id)
        assert info.labels["io.anvil.managed"] == "true"
        assert info.labels["io.anvil.gpus"] == f"{GPU_A},{GPU_B}"
        assert info.gpu_uuids == (GPU_A, GPU_B)

    def test_env_values_enter_the_fingerprint_only_as_a_hash(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        container_id = created(stub_spec(env={"SECRET_LIKE": "value-1"}))
        assert "value-1" not in repr(runtime.inspect(container_id))

    def test_a_changed_env_value_changes_the_fingerprint(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        first = runtime.inspect(created(stub_spec(env={"MODE": "a"})))
        second = runtime.inspect(created(stub_spec(env={"MODE": "b"})))
        assert first.fingerprint != second.fingerprint

    def test_shm_ipc_and_ulimits_round_trip_into_the_same_fingerprint(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        spec = dataclasses.replace(
            stub_spec(), shm_size="1g", ipc_mode="private", ulimits=(("memlock", -1, -1),)
        )
        container_id = created(spec)
        assert runtime.inspect(container_id).fingerprint == config_fingerprint(spec.fingerprint_fields())

    def test_the_simulated_gpus_travel_as_nvidia_visible_devices(
        self, runtime: DockerRuntime, stub_container: StubFactory
    ) -> None:
        info = stub_container(gpu_uuids=[GPU_A], extra_args=["--vram-idle-mib", "1234"])
        assert httpx.get(stub_url(info) + "/anvil/sim/vram").json() == {"gpus": {GPU_A: 1234}}

    def test_nvidia_mode_creates_a_device_request_and_the_same_fingerprint(
        self, stub_spec: SpecFactory, created: Any, docker_client: Any
    ) -> None:
        nvidia = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="nvidia")
        spec = stub_spec(gpu_uuids=[GPU_A])
        container_id = created(spec, nvidia)
        attrs = docker_client.api.inspect_container(container_id)
        request = attrs["HostConfig"]["DeviceRequests"][0]
        assert (request["DeviceIDs"], request["Capabilities"]) == ([GPU_A], [["gpu"]])
        assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in attrs["Config"]["Env"])
        assert nvidia.inspect(container_id).fingerprint == config_fingerprint(spec.fingerprint_fields())
        nvidia.close()

    def test_auto_finds_no_nvidia_runtime_here_and_takes_the_device_path(self) -> None:
        auto = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="auto")
        assert auto.resolved_gpu_mode() == "devices"
        auto.close()

    def test_devices_mode_round_trips_through_docker(
        self,
        stub_spec: SpecFactory,
        created: Any,
        docker_client: Any,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any,
    ) -> None:
        """What Docker keeps of a "devices" container (no GPU here: /dev/null stands in for
        /dev/nvidia0, a file for the driver's library): inspect names the GPU by UUID, and the
        library mount the adapter added stays out of the fingerprint."""
        library = tmp_path / "libcuda.so.1"
        library.write_bytes(b"not a library")
        monkeypatch.setattr(
            nvidia_devices, "device_nodes", lambda uuids, nodes: ["/dev/null:/dev/nvidia0:rwm"]
        )
        monkeypatch.setattr(nvidia_devices, "gpu_nodes", dict)
        monkeypatch.setattr(
            nvidia_devices,
            "read_ldconfig_cache",
            lambda: f"\tlibcuda.so.1 (libc6,x86-64) => {library}\n",
        )
        devices = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="devices")
        spec = stub_spec(gpu_uuids=[GPU_A])
        container_id = created(spec, devices)
        host_config = docker_client.api.inspect_container(container_id)["HostConfig"]
        assert [d["PathInContainer"] for d in host_config["Devices"]] == ["/dev/nvidia0"]
        assert not host_config.get("DeviceRequests")
        assert str(library) in [m["Target"] for m in host_config["Mounts"]]
        info = devices.inspect(container_id)
        assert info.gpu_uuids == (GPU_A,)
        assert info.fingerprint == config_fingerprint(spec.fingerprint_fields())
        devices.close()

    def test_simulated_mode_refuses_a_spec_that_sets_nvidia_visible_devices(
        self, runtime: DockerRuntime, stub_spec: SpecFactory
    ) -> None:
        with pytest.raises(BadInput):
            runtime.create(stub_spec(env={"NVIDIA_VISIBLE_DEVICES": "all"}))

    def test_inspect_by_name_or_id_prefix_is_not_found(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        spec = stub_spec()
        container_id = created(spec)
        for ref in (spec.name, container_id[:12], "0" * 64):
            with pytest.raises(NotFound):
                runtime.inspect(ref)

    def test_list_filters_by_labels(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        mine = created(stub_spec(labels={"io.anvil.slot": "list-test"}))
        other = created(stub_spec(labels={"io.anvil.slot": "elsewhere"}))
        ids = [c.id for c in runtime.list(labels={"io.anvil.slot": "list-test"})]
        assert ids == [mine]
        assert {mine, other} <= {c.id for c in runtime.list()}

    def test_two_fleet_hosts_on_one_engine_each_list_their_own_and_the_unlabelled(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        """`DockerRuntime(host=...)` labels what it creates with its host and lists only
        those and the containers no host labelled (started by hand); a runtime without a host
        lists everything."""
        host_a = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="simulated", host="gpu-a")
        host_b = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="simulated", host="gpu-b")
        try:
            slot = {"io.anvil.slot": "fleet-list-test"}
            of_a = created(stub_spec(labels=slot), host_a)
            of_b = created(stub_spec(labels=slot), host_b)
            by_hand = created(stub_spec(labels=slot))  # no host runtime: no host label
            assert host_a.inspect(of_a).labels["io.anvil.host"] == "gpu-a"
            assert host_b.inspect(of_b).labels["io.anvil.host"] == "gpu-b"
            assert "io.anvil.host" not in runtime.inspect(by_hand).labels
            assert {c.id for c in host_a.list(labels=slot)} == {of_a, by_hand}
            assert {c.id for c in host_b.list(labels=slot)} == {of_b, by_hand}
            assert {c.id for c in runtime.list(labels=slot)} == {of_a, of_b, by_hand}
        finally:
            host_a.close()
            host_b.close()

    def test_image_reports_id_and_tags_and_a_missing_image_is_not_found(
        self, runtime: DockerRuntime, stub_image_id: str
    ) -> None:
        image = runtime.image(stub_image_id)
        assert image.id == stub_image_id
        assert "anvil-stub:local" in image.tags
        with pytest.raises(NotFound):
            runtime.image("anvil-absent:none")


class TestLifecycle:
    def test_start_stop_and_start_again_keeps_the_id_and_fingerprint(
        self, runtime: DockerRuntime, stub_container: StubFactory
    ) -> None:
        info = stub_container(served_model="incumbent")
        assert info.running
        t0 = time.monotonic()
        runtime.stop(info.id, timeout_s=10)
        stopped_in = time.monotonic() - t0
        stopped = runtime.inspect(info.id)
        assert stopped.status == "exited"
        assert stopped_in < 3, "init=True + SIGTERM should stop the stub at once"
        runtime.start(info.id)
        again = runtime.inspect(info.id)
        assert (again.id, again.fingerprint, again.running) == (info.id, info.fingerprint, True)

    def test_stop_kills_a_process_that_ignores_sigterm_after_the_timeout(
        self, runtime: DockerRuntime, stub_spec: SpecFactory, created: Any
    ) -> None:
        stubborn = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"
        spec = dataclasses.replace(stub_spec(), command=("/usr/bin/python3", "-c", stubborn), init=False)
        container_id = created(spec)
        runtime.start(container_id)
        time.sleep(0.5)
        t0 = time.monotonic()
        runtime.stop(container_id, timeout_s=1)
        elapsed = time.monotonic() - t0
        info = runtime.inspect(container_id)
        assert info.status == "exited"
        assert info.exit_code == 137
        assert 0.9 < elapsed < 5

    def test_removing_a_running_container_is_refused_and_leaves_it_running(
        self, runtime: DockerRuntime, stub_container: StubFactory
    ) -> None:
        info = stub_container()
        with pytest.raises(AdapterError) as err:
            runtime.remove(info.id)
        assert not isinstance(err.value, NotFound)
        assert runtime.inspect(info.id).running

    def test_remove_by_id_then_inspect_is_not_found(
        self, runtime: DockerRuntime, stub_container: StubFactory
    ) -> None:
        info = stub_container()
        runtime.stop(info.id, timeout_s=5)
        runtime.remove(info.id)
        with pytest.raises(NotFound):
            runtime.inspect(info.id)

    def test_stub_serves_its_name_inside_the_container(self, stub_container: StubFactory) -> None:
        info = stub_container(served_model="served-x")
        models = httpx.get(stub_url(info) + "/v1/models").json()
        assert models["data"][0]["id"] == "served-x"


class TestErrors:
    def test_an_unreachable_engine_is_an_adapter_error_not_a_docker_exception(self) -> None:
        with pytest.raises(AdapterError):
            DockerRuntime(base_url="unix:///nonexistent/docker.sock")
