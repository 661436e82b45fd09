"""DockerRuntime's error edge and retry policy, against a fake docker client (no engine)."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from anvil_ctl.adapters.docker_fingerprint import inspect_fingerprint_fields, size_bytes
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.core.errors import AdapterError, BadInput, NotFound, TransientError


class FakeApi:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        self.calls += 1
        raise self.error

    def remove_container(self, container_id: str, **kwargs: Any) -> None:
        self.calls += 1
        raise self.error


class FakeClient:
    def __init__(self, error: Exception) -> None:
        self.api = FakeApi(error)

    def close(self) -> None:
        pass


def api_error(status: int) -> docker.errors.APIError:
    class Response:
        status_code = status
        reason = "x"
        url = "http://docker/x"

    return docker.errors.APIError("boom", response=Response())  # type: ignore[arg-type]


class TestErrorTranslation:
    def test_a_5xx_is_transient_and_retried_a_few_times(self) -> None:
        client = FakeClient(api_error(500))
        with pytest.raises(TransientError):
            DockerRuntime(client).inspect("a" * 64)
        assert client.api.calls == 4

    def test_a_connection_error_is_transient(self) -> None:
        client = FakeClient(ConnectionResetError("reset"))
        with pytest.raises(TransientError):
            DockerRuntime(client).inspect("a" * 64)

    def test_not_found_is_translated_and_not_retried(self) -> None:
        client = FakeClient(docker.errors.NotFound("gone"))
        with pytest.raises(NotFound):
            DockerRuntime(client).inspect("a" * 64)
        assert client.api.calls == 1

    def test_a_4xx_is_an_adapter_error_and_not_retried(self) -> None:
        client = FakeClient(api_error(409))
        with pytest.raises(AdapterError) as err:
            DockerRuntime(client).inspect("a" * 64)
        assert not isinstance(err.value, TransientError | NotFound)
        assert client.api.calls == 1

    def test_an_unknown_gpu_mode_is_bad_input(self) -> None:
        with pytest.raises(BadInput):
            DockerRuntime(FakeClient(api_error(500)), gpu_mode="cuda")  # type: ignore[arg-type]


class TestFingerprintFromInspect:
    def test_docker_sizes_are_binary_units(self) -> None:
        assert size_bytes("16g") == 16 * 1024**3
        assert size_bytes("512m") == 512 * 1024**2

    def test_port_bindings_become_port_and_host_binding_pairs(self) -> None:
        attrs = {
            "Config": {"Image": "img"},
            "HostConfig": {"PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]}},
        }
        fields, _ = inspect_fingerprint_fields(attrs, None)
        assert fields["ports"] == [[8000, "127.0.0.1:8001"]]

    def test_image_env_is_not_the_containers_unless_changed(self) -> None:
        attrs = {"Config": {"Image": "img", "Env": ["PATH=/bin", "A=1"], "Labels": {}}}
        with_image, _ = inspect_fingerprint_fields(attrs, {"Env": ["PATH=/bin"]})
        changed, _ = inspect_fingerprint_fields(attrs, {"Env": ["PATH=/usr/bin"]})
        assert with_image["env_keys"] == ["A"]
        assert changed["env_keys"] == ["A", "PATH"]

    def test_a_non_default_ipc_mode_is_seen_even_when_the_spec_left_it_default(self) -> None:
        labels = {"io.anvil.spec.defaults": "ipc_mode"}
        attrs = {"Config": {"Image": "img", "Labels": labels}, "HostConfig": {"IpcMode": "host"}}
        fields, _ = inspect_fingerprint_fields(attrs, None)
        assert fields["ipc_mode"] == "host"
