"""The log audit on real containers (scripts/testenv): Docker's own log, restart count and OOM flag
through `DockerRuntime.logs`, classified with the stub's patterns by the `log_audit` gate.

A container restart is a real one: the stub exits 1 after its first completion
(`--exit-after 1`) under Docker's `on-failure` restart policy, so the daemon restarts it and
counts it. An engine restart inside a container is the stub's `--restart-after`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from anvil_ctl.core.engine_profile import STUB
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.host import LogAudit
from anvil_ctl.qualify.results import GateResult
from tests.integration.conftest import StubFactory, stub_url

NCCL_NOTICE = (
    "host:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin."
)
DEPRECATION = "/usr/lib/python3/torch/_inductor/config.py:12: FutureWarning: `cache_size` is deprecated"


def chat(url: str) -> int:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "Reply with exactly: ok"}]}
    try:
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=10).status_code
    except httpx.TransportError:
        return 0


def audit(runtime: Any, container_id: str, **kw: int) -> GateResult:
    def read(max_lines: int, max_bytes: int) -> Any:
        return runtime.logs(container_id, max_lines=max_lines, max_bytes=max_bytes)

    async def go() -> GateResult:
        async with EngineClient("http://127.0.0.1:9") as client:
            gate_ctx = GateContext(client=client, served_model="stub-model", container_log=read, engine=STUB)
            return await LogAudit(**kw)(gate_ctx)

    return asyncio.run(go())


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class TestDockerLogs:
    def test_the_tail_is_bounded_by_lines_and_says_it_was_cut(
        self, stub_container: StubFactory, runtime: Any
    ) -> None:
        lines = [f"--log-line=notice line {i}" for i in range(30)]
        info = stub_container(extra_args=lines)
        wait_for(
            lambda: (
                "notice line 29" in "\n".join(runtime.logs(info.id, max_lines=100, max_bytes=1 << 20).lines)
            ),
            "log",
        )
        whole = runtime.logs(info.id, max_lines=100, max_bytes=1 << 20)
        assert not whole.truncated and whole.lines[0].startswith("anvil-stub: serving")
        cut = runtime.logs(info.id, max_lines=10, max_bytes=1 << 20)
        assert cut.truncated and cut.lines == whole.lines[-10:]
        small = runtime.logs(info.id, max_lines=100, max_bytes=64)
        assert small.truncated and small.bytes_read <= 64 and small.lines[-1] == "notice line 29"
        assert (whole.status, whole.restart_count, whole.oom_killed) == ("running", 0, False)


class TestLogAuditOnContainers:
    def test_notice_lines_only_pass(self, stub_container: StubFactory, runtime: Any) -> None:
        info = stub_container(extra_args=["--log-line", NCCL_NOTICE, "--log-line", DEPRECATION])
        assert chat(stub_url(info)) == 200
        r = audit(runtime, info.id)
        assert (r.passed, r.classification) == (True, "pass"), r.summary
        assert {n: v["count"] for n, v in r.evidence["notices"].items()} == {
            "nccl-plugin-absent": 1,
            "python-deprecation": 1,
        }

    def test_a_planted_fatal_line_fails_with_the_line_kept(
        self, stub_container: StubFactory, runtime: Any
    ) -> None:
        fatal = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        info = stub_container(extra_args=["--log-line", NCCL_NOTICE, "--log-line", fatal, "--log-after", "1"])
        assert audit(runtime, info.id).passed
        assert chat(stub_url(info)) == 200
        wait_for(lambda: not audit(runtime, info.id).passed, "the planted line")
        r = audit(runtime, info.id)
        assert (r.classification, r.evidence["fatal_counts"]) == ("oom", {"oom": 1})
        assert r.evidence["fatal_lines"][0]["text"] == fatal

    def test_a_container_restarted_by_docker_fails_with_its_restart_count(
        self, stub_container: StubFactory, runtime: Any, docker_client: Any
    ) -> None:
        info = stub_container(extra_args=["--exit-after", "1"])
        docker_client.api.update_container(
            info.id, restart_policy={"Name": "on-failure", "MaximumRetryCount": 1}
        )
        assert chat(stub_url(info)) == 200

        def restarted() -> bool:
            log = runtime.logs(info.id, max_lines=50, max_bytes=65536)
            return log.restart_count == 1 and sum("anvil-stub: serving" in line for line in log.lines) == 2

        wait_for(restarted, "Docker to restart it and the engine to start again")
        r = audit(runtime, info.id)
        assert (r.passed, r.classification) == (False, "restart")
        assert r.evidence["container"]["restart_count"] == 1
        assert r.evidence["engine_restarts"] == 1  # its start banner is in the log twice
        assert "container restarted 1x" in r.summary

    def test_an_engine_restart_inside_the_container_fails(
        self, stub_container: StubFactory, runtime: Any
    ) -> None:
        info = stub_container(extra_args=["--restart-after", "1"])
        assert chat(stub_url(info)) == 200
        wait_for(
            lambda: chat(stub_url(info)) == 200 and audit(runtime, info.id).evidence["engine_restarts"] == 1,
            "restart",
        )
        r = audit(runtime, info.id)
        assert (r.passed, r.classification, r.evidence["container"]["restart_count"]) == (False, "restart", 0)
        assert runtime.inspect(info.id).running
