"""The log audit: engine pattern sets, the classifier, redaction, the bounded log, the gate, and
the gate on a real stub engine process with planted fatal lines, notices and a restart."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from anvil_ctl.core.engine_profile import COMMON_FATAL, ENGINE_PROFILES, engine_profile
from anvil_ctl.core.model import ContainerLog
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates import GATE_TYPES
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.host import LogAudit
from anvil_ctl.qualify.logs import classify, patterns_for, patterns_of, redact
from anvil_ctl.qualify.results import GateResult

REPO = Path(__file__).resolve().parents[2]

# Lines the engines really print (sources: SGLang scheduler.py / engine.py, vLLM core.py and
# api_server.py, NCCL's plugin probe, llama.cpp lines captured in docs/ENGINES.md).
FATAL_LINES = {
    "sglang": [
        (
            "[2026-09-02 12:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            "traceback",
        ),
        (
            "[2026-09-02 12:00:01] Received sigquit from a child process. It usually means the child failed.",
            "engine_error",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
        (
            "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
            "unhandled cuda error",
            "nccl_error",
        ),
        ("host:123:456 [0] NCCL WARN Cuda failure 999 'unknown error'", "nccl_error"),
    ],
    "vllm": [
        (
            "(EngineCore_0 pid=2651) ERROR 06-11 11:46:39 [core.py:517] "
            "EngineCore encountered a fatal error.",
            "engine_error",
        ),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine_error"),
    ],
    "llama-cpp-python": [
        (
            "llama_model_load: error loading model: tensor 'token_embd.weight' "
            "data is not within the file bounds",
            "engine_error",
        ),
        ("gguf_init_from_reader: invalid magic characters: '????', expected 'GGUF'", "engine_error"),
        ("ValueError: Model path does not exist: /model/missing.gguf", "engine_error"),
    ],
    "stub": [
        ("anvil-stub: fatal: planted engine failure", "engine_error"),
        ("Fatal Python error: Segmentation fault", "crash"),
    ],
}

NOTICE_LINES = {
    "sglang": [
        (
            "host:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. "
            "Using internal network plugin.",
            "nccl-plugin-absent",
        ),
        (
            "/usr/lib/python3/dist-packages/torch/_inductor/config.py:1: FutureWarning: `x` is deprecated",
            "python-deprecation",
        ),
    ],
    "llama.cpp": [
        (
            "warning: failed to mlock 31866880-byte buffer (after previously locking 0 bytes): "
            "Cannot allocate memory",
            "mlock-failed",
        ),
    ],
}


class TestEnginePatterns:
    @pytest.mark.parametrize(
        ("engine", "line", "kind"), [(e, line, k) for e, rows in FATAL_LINES.items() for line, k in rows]
    )
    def test_each_engines_real_fatal_lines_are_fatal_of_their_class(
        self, engine: str, line: str, kind: str
    ) -> None:
        found = classify([line], patterns_for(engine))
        assert found.fatal_counts == {kind: 1}

    @pytest.mark.parametrize(
        ("engine", "line", "name"), [(e, line, n) for e, rows in NOTICE_LINES.items() for line, n in rows]
    )
    def test_known_notices_are_counted_with_the_reason_they_are_harmless(
        self, engine: str, line: str, name: str
    ) -> None:
        found = classify([line], patterns_for(engine))
        assert found.fatal_counts == {}
        assert found.notices[name].count == 1 and found.notices[name].reason

    def test_every_notice_pattern_states_why_it_is_not_fatal(self) -> None:
        for patterns in (patterns_of(p) for p in ENGINE_PROFILES.values() if p.own_log_patterns):
            assert patterns.start, patterns.engine
            for notice in patterns.notices:
                assert len(notice.reason) > 20, notice.name

    def test_an_engine_without_a_set_gets_the_common_fatal_set_and_says_so(self) -> None:
        unknown = patterns_for("exllamav3")
        assert (unknown.known, unknown.engine, unknown.start) == (False, "exllamav3", None)
        assert classify(["Traceback (most recent call last):"], unknown).fatal_counts == {"traceback": 1}

    def test_the_patterns_are_the_engine_profiles_and_nowhere_else(self) -> None:
        # One source: every profile with log patterns of its own is what the audit applies,
        # the common fatal set first; a profile without any gets the common set and says so.
        for name, profile in ENGINE_PROFILES.items():
            patterns = patterns_for(name)
            assert patterns.engine == name
            assert patterns.fatal[: len(COMMON_FATAL)] == COMMON_FATAL
            if profile.own_log_patterns:
                assert patterns.known and patterns.fatal == profile.fatal_patterns
                assert (patterns.notices, patterns.start) == (
                    profile.notice_log_patterns,
                    profile.start_banner,
                )
            else:
                assert (patterns.known, patterns.fatal) == (False, COMMON_FATAL)

    def test_engine_names_are_matched_through_aliases(self) -> None:
        assert patterns_for("llama.cpp").engine == "llama-cpp-python"
        assert patterns_for("SGLang").engine == "sglang"


class TestClassify:
    def test_a_fatal_line_is_fatal_even_when_a_notice_matches_it_too(self) -> None:
        line = "NCCL INFO NET/Plugin: Could not find: libnccl-net.so; CUDA error: unknown error"
        found = classify([line], patterns_for("sglang"))
        assert found.fatal_counts == {"cuda_error": 1} and found.notices == {}

    def test_counts_are_complete_while_kept_lines_stop_at_the_limit(self) -> None:
        lines = [f"Traceback (most recent call last): {i}" for i in range(50)]
        found = classify(lines, patterns_for("stub"), keep=5)
        assert found.fatal_counts == {"traceback": 50}
        assert [f["line"] for f in found.fatal] == [1, 2, 3, 4, 5]

    def test_the_start_banner_seen_twice_is_a_restart(self) -> None:
        lines = ["anvil-stub: serving 'm' on 127.0.0.1:1", "ok", "anvil-stub: serving 'm' on 127.0.0.1:1"]
        found = classify(lines, patterns_for("stub"))
        assert (found.restarts, found.fatal_counts) == (1, {"restart": 1})
        assert found.fatal[0]["line"] == 3 and found.other == 1

    def test_kept_lines_are_redacted_and_cut(self) -> None:
        line = "Traceback (most recent call last): api_key='abc123' token=s3cr3t " + "x" * 1000
        kept = classify([line], patterns_for("stub"), secrets=["s3cr3t"]).fatal[0]["text"]
        assert "abc123" not in kept and "s3cr3t" not in kept
        assert kept.endswith("...") and len(kept) <= 403


class TestRedact:
    @pytest.mark.parametrize(
        "line",
        [
            "server_args=ServerArgs(api_key='k-123456', port=8001)",
            "--api-key k-123456 --port 8001",
            "Authorization: Bearer k-123456",
            "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz",
            "using sk-abcdefghijklmnop1234",
        ],
    )
    def test_credential_shaped_values_are_removed(self, line: str) -> None:
        out = redact(line)
        assert "<redacted>" in out
        assert "k-123456" not in out and "hf_abc" not in out and "sk-abc" not in out

    def test_explicit_secrets_are_removed_anywhere(self) -> None:
        assert redact("the token tkn-XYZ leaked", ["tkn-XYZ"]) == "the token <redacted> leaked"


class TestContainerLog:
    def test_lines_beyond_the_cap_are_dropped_oldest_first_and_marked(self) -> None:
        tail = b"".join(f"line {i}\n".encode() for i in range(6))
        log = ContainerLog.bounded(tail, max_lines=5, max_bytes=10_000)
        assert log.lines[0] == "line 1" and len(log.lines) == 5 and log.truncated

    def test_bytes_beyond_the_cap_cut_the_front_and_the_partial_line(self) -> None:
        tail = b"aaaaaaaaaa\nbbbb\ncccc\n"
        log = ContainerLog.bounded(tail, max_lines=10, max_bytes=12)
        assert log.lines == ("bbbb", "cccc") and log.truncated and log.bytes_read == 12

    def test_a_log_within_the_caps_is_whole(self) -> None:
        log = ContainerLog.bounded(b"a\nb\n", max_lines=5, max_bytes=100)
        assert (log.lines, log.truncated) == (("a", "b"), False)


def fake_reader(
    *lines: str, restarts: int = 0, oom: bool = False, status: str = "running"
) -> Callable[[int, int], ContainerLog]:
    def read(max_lines: int, max_bytes: int) -> ContainerLog:
        tail = "".join(line + "\n" for line in lines).encode()
        return replace(
            ContainerLog.bounded(tail, max_lines=max_lines, max_bytes=max_bytes),
            restart_count=restarts,
            oom_killed=oom,
            status=status,
        )

    return read


def audit(reader: Callable[[int, int], ContainerLog] | None, engine: str = "stub", **kw: int) -> GateResult:
    async def go() -> GateResult:
        async with EngineClient("http://127.0.0.1:9") as client:
            gate_ctx = GateContext(
                client=client,
                served_model="m",
                container_log=reader,
                engine=engine_profile(engine),
                secrets=("tok-1",),
            )
            return await LogAudit(**kw)(gate_ctx)

    return asyncio.run(go())


BANNER = "anvil-stub: serving 'm' on 127.0.0.1:8001"


class TestLogAuditGate:
    def test_it_is_registered_for_profiles(self) -> None:
        assert GATE_TYPES["log_audit"] is LogAudit

    def test_only_notice_lines_pass_with_the_notices_counted(self) -> None:
        r = audit(fake_reader(BANNER, NOTICE_LINES["sglang"][0][0], "FutureWarning: x is deprecated"))
        assert (r.passed, r.classification) == (True, "pass")
        assert set(r.evidence["notices"]) == {"nccl-plugin-absent", "python-deprecation"}
        assert "no traceback, restart, CUDA error or OOM" in r.summary

    def test_a_planted_fatal_line_fails_and_is_kept_redacted(self) -> None:
        r = audit(fake_reader(BANNER, "anvil-stub: fatal: planted, token tok-1"))
        assert (r.passed, r.classification) == (False, "fatal_log_line")
        (kept,) = r.evidence["fatal_lines"]
        assert kept["line"] == 2 and "tok-1" not in kept["text"]

    def test_a_container_restart_fails(self) -> None:
        r = audit(fake_reader(BANNER, restarts=1))
        assert (r.passed, r.classification) == (False, "restart")
        assert r.evidence["container"]["restart_count"] == 1

    def test_an_engine_restart_inside_the_container_fails(self) -> None:
        r = audit(fake_reader(BANNER, "anvil-stub: restarting after 3 completions", BANNER))
        assert (r.passed, r.classification, r.evidence["engine_restarts"]) == (False, "restart", 1)

    def test_the_candidates_engine_profile_decides_what_is_fatal(self) -> None:
        line = "llama_model_load: error loading model: tensor 'token_embd.weight' data is not within the file"
        llama = audit(fake_reader("INFO:     Started server process [1]", line), engine="llama-cpp-python")
        assert (llama.passed, llama.classification) == (False, "fatal_log_line")
        assert llama.evidence["patterns"]["engine"] == "llama-cpp-python"
        # The OpenAI-compatible assumptions know only the common set: the line is not theirs.
        generic = audit(fake_reader(line), engine="openai-compatible")
        assert (generic.passed, generic.evidence["patterns"]["known"]) == (True, False)

    def test_an_oom_kill_fails_as_oom(self) -> None:
        r = audit(fake_reader(BANNER, oom=True, status="exited"))
        assert (r.passed, r.classification) == (False, "oom")

    def test_a_container_that_stopped_fails(self) -> None:
        assert audit(fake_reader(BANNER, status="exited")).classification == "not_running"

    def test_without_a_log_source_nothing_is_measured_and_it_fails(self) -> None:
        r = audit(None)
        assert (r.passed, r.classification) == (False, "not_measured")

    def test_the_caps_and_the_window_read_are_in_the_evidence(self) -> None:
        lines = [BANNER, *(f"request {i}" for i in range(30))]
        r = audit(fake_reader(*lines), max_lines=10, max_bytes=4096)
        assert r.evidence["window"] | {"since": ""} == {
            "since": "",
            "max_lines": 10,
            "max_bytes": 4096,
            "lines_read": 10,
            "bytes_read": r.evidence["window"]["bytes_read"],
            "truncated": True,
        }
        assert r.evidence["thresholds"]["max_lines"] == 10


# -- on a real stub engine process ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StubRun:
    """A stub engine process whose stderr (its log) goes to a file, as a container's would."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"stub-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "anvil_stub", "--port", str(self.port), "--served-model", "m", *flags],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("stub did not become healthy")

    def chat(self) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": "Reply with exactly: ok"}]}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=10).status_code

    def reader(self) -> Callable[[int, int], ContainerLog]:
        def read(max_lines: int, max_bytes: int) -> ContainerLog:
            running = self.proc.poll() is None
            log = ContainerLog.bounded(self.log_path.read_bytes(), max_lines=max_lines, max_bytes=max_bytes)
            return replace(log, status="running" if running else "exited")

        return read

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def stub_run(tmp_path: Path) -> Iterator[Callable[..., StubRun]]:
    runs: list[StubRun] = []

    def start(*flags: str) -> StubRun:
        run = StubRun(tmp_path, *flags)
        runs.append(run)
        run.wait_healthy()
        return run

    yield start
    for run in runs:
        run.stop()


def wait_for_line(path: Path, text: str, count: int = 1) -> None:
    deadline = time.monotonic() + 15
    while path.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} x{count} never appeared in {path.read_text()!r}"
        time.sleep(0.05)


class TestOnAStubRun:
    def test_notice_lines_only_pass(self, stub_run: Callable[..., StubRun]) -> None:
        run = stub_run("--log-line", NOTICE_LINES["sglang"][0][0], "--log-line", NOTICE_LINES["sglang"][1][0])
        assert run.chat() == 200
        r = audit(run.reader())
        assert (r.passed, r.evidence["notices"]["nccl-plugin-absent"]["count"]) == (True, 1)

    def test_a_planted_fatal_line_after_the_workload_fails(self, stub_run: Callable[..., StubRun]) -> None:
        run = stub_run("--log-line", "RuntimeError: CUDA error: an illegal memory access", "--log-after", "2")
        assert audit(run.reader()).passed  # nothing printed yet
        assert [run.chat(), run.chat()] == [200, 200]
        wait_for_line(run.log_path, "illegal memory access")
        r = audit(run.reader())
        assert (r.passed, r.classification, r.evidence["fatal_counts"]) == (
            False,
            "fatal_log_line",
            {"cuda_error": 1},
        )

    def test_an_engine_restart_fails(self, stub_run: Callable[..., StubRun]) -> None:
        run = stub_run("--restart-after", "1")
        assert run.chat() == 200
        wait_for_line(run.log_path, "anvil-stub: serving", count=2)
        run.wait_healthy()
        assert run.chat() == 200  # it serves again, once: the restart does not repeat
        r = audit(run.reader())
        assert (r.passed, r.classification, r.evidence["engine_restarts"]) == (False, "restart", 1)
        assert "restarting after 1 completions" in run.log_path.read_text()
