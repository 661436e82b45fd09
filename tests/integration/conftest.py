"""Fixture layer of the integration tests: the hermetic env of scripts/testenv.

Every test under tests/integration/ is marked `integration`. Without the env
(ANVIL_TESTENV unset) they are skipped with a reason, unless
ANVIL_REQUIRE_INTEGRATION=1, in which case they fail: CI must not go green by
skipping. Run them with

    scripts/testenv run -- .venv/bin/python -m pytest tests/integration -q

Fixtures: `docker_client`, `runtime` (DockerRuntime, simulated GPUs),
`stub_image_id`, `free_port` (a callable), and the factory `stub_container`,
which creates and starts a stub container, waits for /health 200 and removes
what it created at teardown. Whole `anvilctl` transactions run on a campaign
host (scripts/chaos.py `ChaosHost`): `campaign_host(work, router)` starts one on
a real smg or HAProxy, and `haproxy_host` is one on HAProxy for a test module.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import httpx
import pytest

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.core.errors import NotFound
from anvil_ctl.core.model import ContainerInfo, ContainerSpec
from tests.integration.hosts import stub_container_spec

if TYPE_CHECKING:
    from scripts.chaos import ChaosHost

REQUIRED_ENV = ("ANVIL_TESTENV", "DOCKER_HOST", "ANVIL_STUB_IMAGE_ID")


def _missing() -> list[str]:
    return [name for name in REQUIRED_ENV if not os.environ.get(name)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("integration") is None:
        return
    missing = _missing()
    if not missing:
        return
    reason = (
        f"integration test needs the hermetic env (missing {', '.join(missing)}); "
        "run: scripts/testenv run -- .venv/bin/python -m pytest tests/integration"
    )
    if os.environ.get("ANVIL_REQUIRE_INTEGRATION") == "1":
        pytest.fail(reason + " [ANVIL_REQUIRE_INTEGRATION=1]", pytrace=False)
    pytest.skip(reason)


def find_free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def free_port() -> Callable[[], int]:
    return find_free_port


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"])
    yield client
    client.close()


@pytest.fixture(scope="session")
def runtime() -> Iterator[Any]:
    rt = DockerRuntime(base_url=os.environ["DOCKER_HOST"], gpu_mode="simulated")
    yield rt
    rt.close()


@pytest.fixture(scope="module", autouse=True)
def _no_containers_outlive_their_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Containers a module created (through anvilctl, where no factory tracks them) are removed
    when it ends: a serve left on a fixed port by one module must not answer for the next."""
    if _missing():
        yield
        return
    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"])
    try:
        before = {c.id for c in client.containers.list(all=True)}
        yield
        for c in client.containers.list(all=True):
            if c.id not in before:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    c.remove(force=True)
    finally:
        client.close()


@pytest.fixture(scope="session")
def stub_image_id(runtime: Any) -> str:
    image_id = os.environ["ANVIL_STUB_IMAGE_ID"]
    assert runtime.image(image_id).id == image_id, "stub image not loaded (scripts/testenv loads it)"
    return image_id


def wait_healthy(url: str, container_id: str, runtime: Any, timeout_s: float = 15.0) -> None:
    """Poll /health until 200; fail early (with the container's logs) if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        info = runtime.inspect(container_id)
        if not info.running:
            logs = runtime._client.api.logs(container_id).decode(errors="replace")
            pytest.fail(f"stub container {container_id[:12]} {info.status}: {logs[-2000:]}")
        time.sleep(0.1)
    pytest.fail(f"stub container {container_id[:12]} not healthy within {timeout_s}s at {url}")


StubFactory = Callable[..., ContainerInfo]


def stub_url(info: ContainerInfo) -> str:
    """http://127.0.0.1:PORT of a container made by `stub_container`."""
    return "http://" + info.labels["io.anvil.binding"]


@pytest.fixture
def stub_spec(stub_image_id: str) -> Callable[..., ContainerSpec]:
    """Factory of stub ContainerSpecs with a unique name (nothing is created)."""

    def make(
        *,
        served_model: str = "stub-model",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        gpu_uuids: Sequence[str] = (),
        name: str | None = None,
    ) -> ContainerSpec:
        return stub_container_spec(
            stub_image_id,
            name=name or f"anvil-test-{uuid.uuid4().hex[:10]}",
            port=port or find_free_port(),
            served_model=served_model,
            extra_args=extra_args,
            env=env,
            labels={"io.anvil.role": "test", **(labels or {})},
            gpu_uuids=gpu_uuids,
        )

    return make


@pytest.fixture
def stub_container(runtime: Any, stub_spec: Callable[..., ContainerSpec]) -> Iterator[StubFactory]:
    """Factory: create + start a stub container, wait for /health 200, return its ContainerInfo.

    `wait_healthy=False` returns right after start (for slow-start or fail-health stubs).
    The label io.anvil.binding holds "127.0.0.1:PORT" (see `stub_url`).
    Everything created is stopped and removed at teardown, by ID.
    """
    created: list[str] = []

    def make(
        *,
        served_model: str = "stub-model",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        gpu_uuids: Sequence[str] = (),
        wait_healthy: bool = True,
    ) -> ContainerInfo:
        port = port or find_free_port()
        spec = stub_spec(
            served_model=served_model,
            port=port,
            extra_args=extra_args,
            env=env,
            labels={"io.anvil.binding": f"127.0.0.1:{port}", **(labels or {})},
            gpu_uuids=gpu_uuids,
        )
        container_id = runtime.create(spec)
        created.append(container_id)
        runtime.start(container_id)
        if wait_healthy:
            wait_healthy_fn(f"http://127.0.0.1:{port}", container_id, runtime)
        info: ContainerInfo = runtime.inspect(container_id)
        return info

    wait_healthy_fn = wait_healthy
    yield make
    for container_id in reversed(created):
        with contextlib.suppress(NotFound):  # the test removed it itself
            runtime.remove(container_id, force=True)


@contextlib.contextmanager
def campaign_host(work: Path, router: str, **kw: Any) -> Iterator[ChaosHost]:
    """A campaign host (scripts/chaos.py) on a fresh real `router` (smg or haproxy): the stub
    incumbent started by hand on 127.0.0.1:8001, routed as llm.primary and adopted, the seeds'
    reserve waiver recorded; `kw` goes to ChaosHost (`incumbent_engine`). At the end its
    router stops and every container made meanwhile is removed, by ID: the next campaign
    host binds the same port."""
    from scripts.chaos import ChaosHost

    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"])
    before = {c.id for c in client.containers.list(all=True)}
    try:
        host = ChaosHost(work, router, **kw)
        try:
            yield host
        finally:
            host.stop()
    finally:
        for c in client.containers.list(all=True):
            if c.id not in before:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    c.remove(force=True)
        client.close()


@pytest.fixture(scope="module")
def haproxy_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosHost]:
    """A campaign host on a real HAProxy (`campaign_host`), for one test module. The incumbent
    is adopted as `openai-compatible`, an engine without a running-requests gauge, so a drain
    of it is counted by HAProxy's own `scur` + `qcur`; the candidates' recipes are the stub's."""
    with campaign_host(
        tmp_path_factory.mktemp("haproxy-host"), "haproxy", incumbent_engine="openai-compatible"
    ) as host:
        yield host
