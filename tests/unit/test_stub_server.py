"""The stub engine as a process: endpoints, streaming, faults, timing, lifecycle.

Each test starts `python3 -m anvil_stub` as a subprocess (the system Python,
standard library only, as in the containers) on a free 127.0.0.1 port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stub:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)

    def post(self, path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def chat(self, text: str, **extra: object) -> dict[str, object]:
        r = self.post("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], **extra})
        assert r.status_code == 200, r.text
        result: dict[str, object] = r.json()
        return result

    def sse(self, body: dict[str, object]) -> list[str]:
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            return [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]


StubFactory = Callable[..., Stub]


@pytest.fixture
def stub() -> Iterator[StubFactory]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None, wait: bool = True) -> Stub:
        port = free_port()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_STUB_")}
        clean.update({"PYTHONPATH": str(REPO), **(env or {})})
        proc = subprocess.Popen(
            [PYTHON, "-m", "anvil_stub", "--port", str(port), *args],
            env=clean,
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started.append(proc)
        s = Stub(proc, port)
        deadline = time.monotonic() + 10
        while wait:
            try:
                s.get("/health")
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline, "stub did not listen within 10 s"
                time.sleep(0.05)
        return s

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


class TestHealthAndModels:
    def test_health_is_200_and_models_reports_served_name_and_max_model_len(self, stub: StubFactory) -> None:
        s = stub("--served-model", "stub-a", "--max-model-len", "4096")
        assert s.get("/health").status_code == 200
        card = s.get("/v1/models").json()["data"][0]
        assert (card["id"], card["max_model_len"]) == ("stub-a", 4096)

    def test_no_model_or_tokenizer_path_is_reported_anywhere(self, stub: StubFactory) -> None:
        s = stub("--served-model", "stub-a")
        text = s.get("/v1/models").text + json.dumps(s.chat("hi"))
        assert "path" not in text and "tokenizer" not in text and "root" not in text

    def test_fail_health_answers_503(self, stub: StubFactory) -> None:
        assert stub("--fail-health").get("/health").status_code == 503

    def test_slow_start_listens_at_once_but_is_503_until_the_delay_passed(self, stub: StubFactory) -> None:
        s = stub("--slow-start", "1.0")
        assert s.get("/health").status_code == 503
        assert s.get("/v1/models").status_code == 503
        time.sleep(1.1)
        assert s.get("/health").status_code == 200
        assert s.get("/v1/models").status_code == 200

    def test_wrong_served_name_is_reported_in_models_and_responses(self, stub: StubFactory) -> None:
        s = stub("--served-model", "right", "--wrong-served-name", "wrong")
        assert s.get("/v1/models").json()["data"][0]["id"] == "wrong"
        assert s.chat("hi")["model"] == "wrong"

    def test_env_twin_sets_the_served_model_and_the_flag_wins(self, stub: StubFactory) -> None:
        env = {"ANVIL_STUB_SERVED_MODEL": "env-name"}
        assert stub(env=env).get("/v1/models").json()["data"][0]["id"] == "env-name"
        flagged = stub("--served-model", "flag-name", env=env)
        assert flagged.get("/v1/models").json()["data"][0]["id"] == "flag-name"

    def test_unknown_route_is_404(self, stub: StubFactory) -> None:
        assert stub().get("/nope").status_code == 404


class TestChatCompletions:
    def test_plain_chat_answers_with_content_reasoning_and_usage(self, stub: StubFactory) -> None:
        body = stub("--served-model", "m").chat("Reply with exactly: pong")
        choice = body["choices"][0]  # type: ignore[index]
        assert choice["message"]["content"] == "pong"
        assert len(choice["message"]["reasoning_content"]) == 16 * 4
        assert choice["finish_reason"] == "stop"
        assert body["usage"] == {  # type: ignore[comparison-overlap]
            "prompt_tokens": 8 + 6,
            "completion_tokens": 17,
            "total_tokens": 31,
            "completion_tokens_details": {"reasoning_tokens": 16},
        }

    def test_a_tool_call_has_finish_reason_tool_calls(self, stub: StubFactory) -> None:
        tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
        body = stub().chat('call `add` with arguments JSON {"a": 1}', tools=tools)
        choice = body["choices"][0]  # type: ignore[index]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert (call["function"]["name"], call["function"]["arguments"]) == ("add", '{"a": 1}')

    def test_a_prompt_above_max_model_len_is_400(self, stub: StubFactory) -> None:
        s = stub("--max-model-len", "20")
        r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 100}]})
        assert r.status_code == 400
        assert "max_model_len" in r.json()["error"]["message"]

    def test_a_body_that_is_not_json_is_400(self, stub: StubFactory) -> None:
        r = httpx.post(stub().url + "/v1/chat/completions", content=b"{nope", timeout=5)
        assert r.status_code == 400

    def test_the_answer_book_is_read_from_a_file(self, stub: StubFactory, tmp_path: Path) -> None:
        book = tmp_path / "book.json"
        book.write_text(json.dumps([{"match": "capital", "answer": "Paris"}]))
        body = stub("--answer-book", str(book)).chat("the capital?")
        assert body["choices"][0]["message"]["content"] == "Paris"  # type: ignore[index]


class TestStreaming:
    def test_a_stream_carries_reasoning_then_content_then_finish_usage_and_done(
        self, stub: StubFactory
    ) -> None:
        events = stub("--reasoning-tokens", "2").sse(
            {
                "messages": [{"role": "user", "content": "Reply with exactly: abcdefgh"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert deltas[0]["role"] == "assistant"
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me t"
        assert "".join(d.get("content", "") for d in deltas) == "abcdefgh"
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 4

    def test_without_include_usage_there_is_no_usage_chunk(self, stub: StubFactory) -> None:
        events = stub().sse({"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert all("usage" not in json.loads(e) for e in events[:-1])

    def test_fault_truncate_stream_stops_after_half_the_content_without_done_or_usage(
        self, stub: StubFactory
    ) -> None:
        events = stub("--fault", "truncate-stream").sse(
            {
                "messages": [{"role": "user", "content": "Reply with exactly: abcdefghijklmnop"}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "chat_template_kwargs": {"enable_thinking": False},
            }
        )
        assert "[DONE]" not in events
        content = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events)
        assert content == "abcdefgh"
        assert all("usage" not in json.loads(e) for e in events)


class TestResponsesApi:
    def test_a_string_input_returns_output_text_and_usage(self, stub: StubFactory) -> None:
        r = stub("--served-model", "m").post("/v1/responses", {"input": "Reply with exactly: yes"})
        body = r.json()
        assert r.status_code == 200
        assert body["output_text"] == "yes"
        message = next(o for o in body["output"] if o["type"] == "message")
        assert message["content"][0] == {"type": "output_text", "text": "yes", "annotations": []}
        assert body["usage"]["output_tokens"] == 17
        assert body["model"] == "m"

    def test_a_message_list_input_is_answered_by_the_last_message(self, stub: StubFactory) -> None:
        r = stub().post(
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "Reply with exactly: first"},
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Reply with exactly: second"}],
                    },
                ],
                "max_output_tokens": 100,
            },
        )
        assert r.json()["output_text"] == "second"


class TestTiming:
    def test_first_token_after_prefill_and_decode_rate_within_one_percent(self, stub: StubFactory) -> None:
        """The stub never answers early (every attempt), and paces as told: on a loaded machine
        the client's clock adds scheduling delays, so the closest of three attempts is judged
        (a stub that paced wrongly misses the bounds on all three)."""
        # prompt: 400 bytes -> 100 tokens + 8 = 108 tokens; prefill 360 tok/s -> 0.3 s
        s = stub("--prefill-tps", "360", "--decode-tps", "50", "--verbose-default")
        body = {
            "messages": [{"role": "user", "content": "y" * 400}],
            "stream": True,
            "max_tokens": 51,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        s.chat("warm up", max_tokens=1)
        attempts: list[tuple[float, float]] = []
        for _ in range(3):
            stamps: list[float] = []
            client = httpx.Client(timeout=30)  # built before t0: its setup is not the engine's time
            t0 = time.monotonic()
            with client, client.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                        "content"
                    ):
                        stamps.append(time.monotonic())
            assert len(stamps) == 51
            ttft = stamps[0] - t0
            assert ttft >= 0.3, ttft  # never before the prefill time has passed
            attempts.append((ttft, (len(stamps) - 1) / (stamps[-1] - stamps[0])))
            if ttft < 0.32 and abs(attempts[-1][1] - 50) / 50 < 0.01:
                break
        ttft, rate = min(attempts, key=lambda a: a[0] - 0.3 + abs(a[1] - 50) / 50)
        assert 0.3 <= ttft < 0.32, attempts
        assert abs(rate - 50) / 50 < 0.01, attempts


class TestVram:
    def test_vram_is_idle_once_healthy_and_loaded_after_n_requests(self, stub: StubFactory) -> None:
        s = stub(
            "--vram-idle-mib",
            "1000",
            "--vram-loaded-mib",
            "5000",
            "--vram-after-requests",
            "2",
            env={"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"},
        )
        assert s.get("/anvil/sim/vram").json() == {"gpus": {"GPU-1": 1000, "GPU-2": 1000}}
        s.chat("one")
        assert s.get("/anvil/sim/vram").json()["gpus"]["GPU-1"] == 1000
        s.chat("two")
        assert s.get("/anvil/sim/vram").json() == {"gpus": {"GPU-1": 5000, "GPU-2": 5000}}

    def test_vram_is_zero_while_starting(self, stub: StubFactory) -> None:
        s = stub("--slow-start", "5", "--vram-idle-mib", "1000", env={"NVIDIA_VISIBLE_DEVICES": "GPU-1"})
        assert s.get("/anvil/sim/vram").json() == {"gpus": {"GPU-1": 0}}


class TestLifecycle:
    def test_sigterm_exits_zero_within_a_second(self, stub: StubFactory) -> None:
        s = stub()
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=5) == 0
        assert time.monotonic() - t0 < 1.0

    def test_sigterm_finishes_the_streams_in_flight_and_admits_no_new_one(self, stub: StubFactory) -> None:
        s = stub("--decode-tps", "100", "--verbose-default")
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 150, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # in flight
            s.proc.send_signal(signal.SIGTERM)
            refused = _poll(
                lambda: s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "y"}]})
            )
            rest = [line for line in lines if line.startswith("data: ")]
        assert refused.status_code == 503
        assert rest[-1] == "data: [DONE]" and '"finish_reason": "length"' in rest[-2]
        assert s.proc.wait(timeout=10) == 0

    def test_exit_after_n_completions_the_process_exits_with_1(self, stub: StubFactory) -> None:
        s = stub("--exit-after", "2")
        s.chat("one")
        s.chat("two")
        assert s.proc.wait(timeout=5) == 1


def _poll(call: Callable[[], httpx.Response], *, until: int = 503, within_s: float = 5.0) -> httpx.Response:
    """`call()` again until it answers `until` (the stub notices SIGTERM within 0.5 s)."""
    deadline = time.monotonic() + within_s
    while True:
        answer = call()
        if answer.status_code == until or time.monotonic() >= deadline:
            return answer
        time.sleep(0.05)


class TestMetrics:
    def test_the_running_requests_gauge_counts_the_completions_in_flight(self, stub: StubFactory) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        def running() -> float:
            families = text_string_to_metric_families(s.get("/metrics").text)
            return sum(x.value for f in families for x in f.samples if x.name == "stub:num_requests_running")

        s = stub("--decode-tps", "100", "--verbose-default")
        assert running() == 0
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert running() == 1
            assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
        deadline = time.monotonic() + 5
        while running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running() == 0


class TestShmFileKnob:
    def test_shm_files_are_held_while_running_and_left_behind_at_exit(
        self, stub: StubFactory, tmp_path: Path
    ) -> None:
        s = stub("--shm-dir", str(tmp_path), "--shm-file", "nccl-stub01", "--shm-file", "kv-left")
        held = set()
        for fd in os.listdir(f"/proc/{s.proc.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # a probe's socket closed meanwhile
                held.add(os.readlink(f"/proc/{s.proc.pid}/fd/{fd}"))
        assert {str(tmp_path / "nccl-stub01"), str(tmp_path / "kv-left")} <= held
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=5) == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kv-left", "nccl-stub01"]
        assert (tmp_path / "kv-left").stat().st_size == 4096

    def test_the_env_twin_names_the_files_and_a_path_is_refused(self, tmp_path: Path) -> None:
        from anvil_stub.options import parse_options

        env = {"ANVIL_STUB_SHM_FILE": "a, b", "ANVIL_STUB_SHM_DIR": str(tmp_path)}
        o = parse_options([], env)
        assert (o.shm_files, o.shm_dir) == (("a", "b"), str(tmp_path))
        with pytest.raises(SystemExit):
            parse_options(["--shm-file", "../escape"], {})


class TestAClientThatGoesAway:
    def test_a_reset_connection_is_no_traceback_on_stderr(self, stub: StubFactory) -> None:
        """HAProxy closes its health checks with a TCP reset: a real engine's server drops the
        connection quietly, and a watch counts every traceback on stderr as a fatal line."""
        import socket
        import struct

        s = stub()
        port = int(s.url.rsplit(":", 1)[1])
        for _ in range(20):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: stub\r\n\r\n")
            conn.close()  # SO_LINGER 0: a reset, before the answer is read
        assert s.get("/health").status_code == 200
        s.proc.terminate()
        s.proc.wait(timeout=10)
        err = s.proc.stderr.read().decode() if s.proc.stderr else ""
        assert "Traceback" not in err, err[-2000:]
