"""The stub engine's HTTP server: endpoints, SSE streaming, simulated timing, faults, VRAM.

Token i of a completion is due at t0 + prompt_tokens/prefill_tps + i/decode_tps on an
absolute schedule, so measurements have a ground truth. On SIGTERM it stops as vLLM and
SGLang do: no new completion (503), those in flight finish within `--stop-timeout`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, TypeAlias

from anvil_stub.options import StubOptions, parse_options
from anvil_stub.rules import BadRequest, Completion, Prompt, chat_prompt, complete, load_answer_book
from anvil_stub.rules import responses_prompt as responses_prompt_of
from anvil_stub.state import RESTARTED_ENV, Pacer, StubState, log_line

RUNNING_METRIC = "stub:num_requests_running"

# JSON as the stub writes it (the stub imports nothing of anvil_ctl: it runs alone in containers).
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None
JSONObject: TypeAlias = dict[str, JSONValue]
JSONArray: TypeAlias = list[JSONValue]


def _usage(prompt: Prompt, c: Completion) -> JSONObject:
    return {
        "prompt_tokens": prompt.tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": prompt.tokens + c.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": len(c.reasoning_tokens)},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "anvil-stub/1"
    # TCP_NODELAY, as uvicorn sets it: without it a body waits for the ACK of its headers.
    disable_nagle_algorithm = True
    state: StubState  # set on the subclass made by make_server

    def log_message(self, format: str, *args: object) -> None:
        return  # quiet: request logs would drown test output

    def handle(self) -> None:
        # A client that went away is dropped quietly: a traceback would be a fatal line to a watch.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _body(self) -> dict[str, object]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def _sse(self, payload: object) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    # ------------------------------------------------------------ routes

    def do_GET(self) -> None:
        st = self.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if st.healthy():
                self._send_json(200, {"status": "ok"})
            else:
                self._error(503, "starting" if st.warming() else "unhealthy")
        elif path == "/v1/models":
            if st.warming():
                self._error(503, "starting")
                return
            card = {
                "id": st.options.reported_name,
                "object": "model",
                "created": 0,
                "owned_by": "anvil-stub",
                "max_model_len": st.options.max_model_len,
            }
            self._send_json(200, {"object": "list", "data": [card]})
        elif path == "/metrics":
            data = (
                f"# HELP {RUNNING_METRIC} Completions being answered now.\n"
                f"# TYPE {RUNNING_METRIC} gauge\n"
                f'{RUNNING_METRIC}{{model_name="{st.options.served_model}"}} {st.running}\n'
            )
            self._send(200, data.encode(), "text/plain; version=0.0.4")
        elif path == "/anvil/sim/vram":
            self._send_json(200, {"gpus": st.vram()})
        elif path == "/anvil/sim/timings":
            with st.lock:
                onsets = {"started_at": round(st.started_at, 3), "onsets": st.onsets()}
                self._send_json(200, {"timings": list(st.timings), **onsets})
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/chat/completions", "/v1/responses"):
            self._error(404, f"no route {path}")
            return
        st = self.state
        t0 = time.monotonic()
        try:
            body = self._body()
            prompt = chat_prompt(body) if path == "/v1/chat/completions" else responses_prompt_of(body)
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        if st.warming():
            self._error(503, "starting")
            return
        if prompt.tokens > (limit := st.options.max_model_len):
            self._error(400, f"prompt has {prompt.tokens} tokens, more than max_model_len {limit}")
            return
        before = st.admit()
        if before is None:
            self._error(503, "shutting down")
            return
        late = st.late_effects(before)  # the late faults due for it (their onsets noted)
        try:
            if late.http_500:
                self._error(500, "injected fault (http-500)")
                return
            o = st.options
            completion = complete(
                prompt,
                answer_book=st.answer_book,
                faults=o.faults,
                reasoning_tokens=o.reasoning_tokens,
                verbose_default=o.verbose_default,
                default_max_tokens=o.default_max_tokens,
            )
            pacer = Pacer(o, prompt.tokens, t0, late)
            if path == "/v1/responses":
                pacer.wait_for(max(completion.completion_tokens - 1, 0))
                self._send_json(200, self._responses_body(prompt, completion))
            elif body.get("stream"):
                self._stream_chat(prompt, completion, pacer, body, truncate=late.truncate)
            else:
                pacer.wait_for(max(completion.completion_tokens - 1, 0))
                self._send_json(200, self._chat_body(prompt, completion))
            timing = pacer.timing()
            if timing is not None:
                with st.lock:
                    st.timings.append({"seq": next(st.timing_seq), **timing, "late_faults": [*late.kinds]})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer
        finally:
            st.finished()

    # ------------------------------------------------------------ chat

    def _chat_body(self, prompt: Prompt, c: Completion) -> JSONObject:
        message: JSONObject = {"role": "assistant", "content": c.content or None}
        if c.reasoning_tokens:
            message["reasoning_content"] = c.reasoning
        if c.tool_call is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self.state.ids)}",
                    "type": "function",
                    "function": {"name": c.tool_call.name, "arguments": c.arguments},
                }
            ]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "id": f"chatcmpl-{next(self.state.ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.state.options.reported_name,
            "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}],
            "usage": _usage(prompt, c),
        }

    def _stream_chat(
        self, prompt: Prompt, c: Completion, pacer: Pacer, body: Mapping[str, object], *, truncate: bool
    ) -> None:
        st = self.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        cid = f"chatcmpl-{next(st.ids)}"
        created = int(time.time())

        def chunk(delta: JSONObject, finish: str | None = None) -> JSONObject:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": st.options.reported_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }

        deltas: list[JSONObject] = [{"reasoning_content": t} for t in c.reasoning_tokens]
        if c.tool_call is not None:
            head: JSONObject = {"index": 0, "id": f"call_{next(st.ids)}", "type": "function"}
            first_args = c.tool_tokens[0] if c.tool_tokens else ""
            function: JSONObject = {"name": c.tool_call.name, "arguments": first_args}
            deltas.append({"tool_calls": [{**head, "function": function}]})
            deltas.extend(
                {"tool_calls": [{"index": 0, "function": {"arguments": t}}]} for t in c.tool_tokens[1:]
            )
        else:
            deltas.extend({"content": t} for t in c.content_tokens)
        cut_at = None
        if truncate or "truncate-stream" in st.options.faults:
            cut_at = len(c.reasoning_tokens) + len(c.content_tokens) // 2
        if not deltas:
            self._sse(chunk({"role": "assistant", "content": ""}))
        for i, delta in enumerate(deltas):
            if cut_at is not None and i >= cut_at:
                return  # the connection closes without finish, usage or [DONE]
            pacer.wait_for(i)
            self._sse(chunk({"role": "assistant", **delta} if i == 0 else delta))
        if cut_at is not None:
            return
        self._sse(chunk({}, c.finish_reason))
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            self._sse({**chunk({}), "choices": [], "usage": _usage(prompt, c)})
        self._sse("[DONE]")

    # ------------------------------------------------------------ responses

    def _responses_body(self, prompt: Prompt, c: Completion) -> JSONObject:
        st = self.state
        rid = next(st.ids)
        output: JSONArray = []
        if c.reasoning_tokens:
            output.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{rid}",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": c.reasoning}],
                }
            )
        if c.tool_call is not None:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{rid}",
                    "call_id": f"call_{rid}",
                    "name": c.tool_call.name,
                    "arguments": c.arguments,
                    "status": "completed",
                }
            )
        else:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{rid}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": c.content, "annotations": []}],
                }
            )
        incomplete = c.finish_reason == "length"
        return {
            "id": f"resp_{rid}",
            "object": "response",
            "created_at": int(time.time()),
            "model": st.options.reported_name,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output,
            "output_text": c.content,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": prompt.tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": c.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": len(c.reasoning_tokens)},
                "total_tokens": prompt.tokens + c.completion_tokens,
            },
        }


def make_server(
    options: StubOptions, answer_book: list[tuple[str, str]]
) -> tuple[ThreadingHTTPServer, StubState]:
    state = StubState(options, answer_book)
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((options.host, options.port), handler)
    server.daemon_threads = True
    return server, state


def hold_shm_files(options: StubOptions) -> list[IO[bytes]]:
    """Create each --shm-file (4 KiB) in --shm-dir and keep it open, never unlinked: residue to be found."""
    held: list[IO[bytes]] = []
    for name in options.shm_files:
        fh = open(os.path.join(options.shm_dir, name), "w+b")  # noqa: SIM115 - held until exit
        fh.write(b"\0" * 4096)
        fh.flush()
        held.append(fh)
    return held


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until --exit-after is reached (exit 1)."""
    options = parse_options(sys.argv[1:] if argv is None else argv, os.environ)
    book = load_answer_book(Path(options.answer_book).read_text()) if options.answer_book else []
    held = hold_shm_files(options)
    server, state = make_server(options, book)

    def on_signal(signum: int, frame: object) -> None:
        state.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    log_line(f"anvil-stub: serving {options.served_model!r} on {options.host}:{options.port}")
    with state.lock:
        state.print_log_lines()
    while not state.stop.wait(0.1 if options.late_faults else 0.5):
        state.tick()
    # Graceful: no new completion is admitted (state.admit), those in flight finish.
    end = time.monotonic() + options.stop_timeout
    while state.running and time.monotonic() < end:
        time.sleep(0.05)
    server.shutdown()
    server.server_close()
    for fh in held:
        fh.close()
    if state.restart and argv is None:
        log_line(f"anvil-stub: restarting after {state.completions_done} completions (--restart-after)")
        os.environ[RESTARTED_ENV] = "1"
        # The same interpreter and arguments: what a supervisor restarting the engine runs.
        os.execv(sys.executable, [sys.executable, "-m", "anvil_stub", *sys.argv[1:]])  # noqa: S606
    return state.exit_code
