"""A real engine nobody here wrote: llama.cpp (llama-cpp-python 0.3.36) in a real container.

The container is made from recipes/llama-smollm2-2k.toml exactly (image, entrypoint,
args, env, mounts) except for two values a test must own: the port (a free one on
loopback instead of the slot's 8001) and the model mount's source (the test env's
ANVIL_MODEL_CACHE). It runs in the private dockerd of scripts/testenv, which loads the
engine image (ANVIL_LLAMA_IMAGE_ID); the model is bind-mounted read-only.

What is checked is what an engine profile for llama.cpp has to know (docs/ENGINES.md):
readiness is `/v1/models` listing the served name (there is no `/health`: 404), the
official `openai` client gets `usage` on a plain chat, a streamed chat ends with a
finish_reason and `[DONE]` but no usage chunk even when asked for one, the timing lines
`llama_perf_context_print` appear in the container log, and a corrupt model makes the
container exit 1 with llama.cpp's own fatal lines.

Set ANVIL_LLAMA_REPORT=PATH to get the measured timings and log lines as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from anvil_ctl.adapters.hfcache import HfCache
from anvil_ctl.core.engine_profile import LLAMA_CPP_PYTHON
from anvil_ctl.core.errors import NotFound
from anvil_ctl.core.model import ContainerSpec, Mount
from anvil_ctl.core.model import hub_repo_folder as repo_folder
from anvil_ctl.qualify.logs import classify, patterns_of
from anvil_ctl.recipes.model import Recipe, load_recipe
from tests.integration.conftest import find_free_port

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "llama-smollm2-2k.toml"
MODEL_MOUNT = "/model"
PERF_PREFIX = "llama_perf_context_print:"
REPORT: dict[str, Any] = {}


def _need(name: str) -> str:
    value = os.environ.get(name)
    if value:
        return value
    reason = (
        f"{name} is not set: build the llama engine (make llama-wheel llama-model llama-image) "
        "and run inside scripts/testenv, which loads the image and exports it"
    )
    if os.environ.get("ANVIL_REQUIRE_INTEGRATION") == "1":
        pytest.fail(reason + " [ANVIL_REQUIRE_INTEGRATION=1]", pytrace=False)
    pytest.skip(reason)


@dataclass
class Served:
    url: str
    container_id: str
    recipe: Recipe
    served_model: str
    ready_s: float
    models_body: dict[str, Any] = field(default_factory=dict)


def _logs(runtime: Any, container_id: str) -> str:
    return str(runtime._client.api.logs(container_id).decode(errors="replace"))


def _spec(recipe: Recipe, image_id: str, model_repo_dir: Path, port: int, name: str) -> ContainerSpec:
    """The recipe's container, on `port`, with the model cache of this env at its model_mount."""
    args = list(recipe.args)
    args[args.index("--port") + 1] = str(port)
    assert recipe.model_mount == MODEL_MOUNT
    mounts = (
        *(Mount(**m.model_dump()) for m in recipe.mounts),
        Mount(str(model_repo_dir), MODEL_MOUNT, True),
    )
    return ContainerSpec(
        name=name,
        image=image_id,
        command=tuple(args),
        entrypoint=recipe.entrypoint,
        env=tuple(sorted(recipe.env.items())),
        labels=(
            ("io.anvil.binding", f"127.0.0.1:{port}"),
            ("io.anvil.managed", "true"),
            ("io.anvil.recipe", recipe.name),
            ("io.anvil.role", "test"),
        ),
        mounts=mounts,
        network_mode="host",
        init=True,
    )


def _wait_listed(url: str, served: str, container_id: str, runtime: Any, timeout_s: float) -> dict[str, Any]:
    """Poll GET /v1/models until it lists `served`; fail at once (with logs) if the container exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + "/v1/models", timeout=2)
            last = f"{r.status_code} {r.text[:200]}"
            if r.status_code == 200 and served in [m.get("id") for m in r.json().get("data", [])]:
                body: dict[str, Any] = r.json()
                return body
        except httpx.TransportError as exc:
            last = repr(exc)
        info = runtime.inspect(container_id)
        if not info.running:
            logs = _logs(runtime, container_id)[-3000:]
            pytest.fail(f"llama container {info.status} (exit {info.exit_code}): {logs}")
        time.sleep(0.1)
    pytest.fail(f"{url}/v1/models did not list {served!r} within {timeout_s}s; last: {last}")


@pytest.fixture(scope="module")
def llama_image_id(runtime: Any) -> str:
    image_id = _need("ANVIL_LLAMA_IMAGE_ID")
    assert runtime.image(image_id).id == image_id, "llama image not loaded (scripts/testenv loads it)"
    return image_id


@pytest.fixture(scope="module")
def model_repo_dir() -> Path:
    """The model's repository folder in this env's cache, verified complete for the recipe's identity."""
    cache = Path(_need("ANVIL_MODEL_CACHE"))
    recipe = load_recipe(RECIPE)
    assert recipe.model is not None
    report = HfCache(cache).verify_identity(recipe.model)
    assert report.complete, f"model cache incomplete (make llama-model): {report.problems}"
    return cache / repo_folder(report.repo_id)


@pytest.fixture(scope="module")
def served(runtime: Any, llama_image_id: str, model_repo_dir: Path) -> Iterator[Served]:
    """One llama container of the 2k recipe, ready; removed (by ID) at the end of the module."""
    recipe = load_recipe(RECIPE)
    assert recipe.served_model is not None
    port = find_free_port()
    spec = _spec(recipe, llama_image_id, model_repo_dir, port, f"anvil-test-llama-{uuid.uuid4().hex[:10]}")
    container_id = runtime.create(spec)
    try:
        t0 = time.monotonic()
        runtime.start(container_id)
        url = f"http://127.0.0.1:{port}"
        body = _wait_listed(url, recipe.served_model, container_id, runtime, recipe.startup_timeout_s)
        ready_s = time.monotonic() - t0
        REPORT["start_to_ready_s"] = round(ready_s, 3)
        yield Served(url, container_id, recipe, recipe.served_model, ready_s, body)
    finally:
        with contextlib.suppress(NotFound):
            runtime.remove(container_id, force=True)
        if path := os.environ.get("ANVIL_LLAMA_REPORT"):
            Path(path).write_text(json.dumps(REPORT, indent=2, sort_keys=True) + "\n")


def test_the_recipe_pins_the_image_the_env_loaded(llama_image_id: str) -> None:
    """A rebuilt wheel gives a new image ID; the recipes must be re-pinned to it."""
    assert load_recipe(RECIPE).image == llama_image_id
    assert load_recipe(REPO / "recipes" / "llama-smollm2-8k.toml").image == llama_image_id


def test_readiness_is_the_model_list_and_there_is_no_health(served: Served, runtime: Any) -> None:
    ids = [m["id"] for m in served.models_body["data"]]
    assert ids == [served.served_model]
    # llama-cpp-python reports no context length in /v1/models (the stub reports max_model_len)
    assert "max_model_len" not in served.models_body["data"][0]
    assert httpx.get(served.url + "/health", timeout=5).status_code == 404
    mounts = runtime._client.api.inspect_container(served.container_id)["Mounts"]
    model = next(m for m in mounts if m["Destination"] == MODEL_MOUNT)
    assert model["RW"] is False


def test_a_chat_through_the_official_client_reports_usage(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        t0 = time.monotonic()
        resp = client.chat.completions.create(
            model=served.served_model,
            messages=[{"role": "user", "content": "Say hello in one short sentence."}],
            max_tokens=32,
            temperature=0,
        )
        latency = time.monotonic() - t0
    finally:
        client.close()
    assert resp.model == served.served_model
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    REPORT["chat"] = {
        "latency_s": round(latency, 3),
        "usage": usage.model_dump(exclude_none=True),
        "finish_reason": resp.choices[0].finish_reason,
        "content": resp.choices[0].message.content,
    }


def test_the_context_shows_only_in_the_context_length_error(served: Served) -> None:
    """/v1/models has no context length; a prompt longer than n_ctx gets a 400 that names it."""
    context_tokens = served.recipe.context_tokens
    body = {
        "model": served.served_model,
        "messages": [{"role": "user", "content": "word " * (context_tokens + 100)}],
        "max_tokens": 1,
    }
    t0 = time.monotonic()
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
    elapsed = time.monotonic() - t0
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"maximum context length is {context_tokens} tokens" in error["message"]
    REPORT["context_error"] = {"seconds": round(elapsed, 3), "error": error}


def test_a_streamed_chat_ends_with_a_finish_reason_and_done_but_no_usage(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        t0 = time.monotonic()
        first: float | None = None
        chunks = []
        stream = client.chat.completions.create(
            model=served.served_model,
            messages=[{"role": "user", "content": "Count from one to five."}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - t0
            chunks.append(chunk)
        latency = time.monotonic() - t0
    finally:
        client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason == finishes[0]
    # Observed: include_usage is ignored; no chunk carries usage (an OpenAI server sends one).
    assert [c for c in chunks if c.usage is not None] == []
    # The raw stream ends with the SSE terminator the client swallows.
    body = {
        "model": served.served_model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        data = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert all('"usage"' not in line for line in data)
    REPORT["stream"] = {
        "latency_s": round(latency, 3),
        "first_content_s": round(first or 0.0, 3),
        "chunks": len(chunks),
        "finish_reason": finishes[0],
    }


def test_a_second_stream_queues_behind_the_first_instead_of_cutting_it(served: Served) -> None:
    """The recipe sets --interrupt_requests false; the server's default cuts the running stream."""
    assert served.recipe.args[served.recipe.args.index("--interrupt_requests") + 1] == "false"
    body = {
        "model": served.served_model,
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "max_tokens": 24,
        "stream": True,
    }
    results: dict[int, list[str] | BaseException] = {}
    started = threading.Event()

    def stream(i: int) -> None:
        lines: list[str] = []
        try:
            with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        started.set()
            results[i] = lines
        except httpx.HTTPError as exc:
            results[i] = exc

    first = threading.Thread(target=stream, args=(1,))
    first.start()
    assert started.wait(60), "the first stream sent nothing"
    second = threading.Thread(target=stream, args=(2,))
    second.start()
    first.join(120)
    second.join(120)
    for i in (1, 2):
        got = results[i]
        assert isinstance(got, list), f"stream {i}: {got!r}"
        assert got[-1] == "data: [DONE]", f"stream {i} ended with {got[-1]!r}"


def test_timing_lines_are_in_the_container_log(served: Served, runtime: Any) -> None:
    """llama.cpp prints `llama_perf_context_print` lines after each completion."""
    deadline = time.monotonic() + 10
    perf: list[str] = []
    while time.monotonic() < deadline:
        perf = [
            line for line in _logs(runtime, served.container_id).splitlines() if line.startswith(PERF_PREFIX)
        ]
        if any("prompt eval time" in line for line in perf) and any(" eval time" in line for line in perf):
            break
        time.sleep(0.2)
    assert any("prompt eval time" in line for line in perf), perf
    assert any("total time" in line for line in perf), perf
    logs = _logs(runtime, served.container_id)
    assert "failed to mlock" not in logs  # the recipe turns mlock off
    REPORT["perf_lines"] = perf
    REPORT["cpu_features"] = next((x for x in logs.splitlines() if x.startswith("CPU : ")), "")
    REPORT["log_lines"] = len(logs.splitlines())


def test_a_corrupt_model_exits_1_with_llama_cpps_fatal_lines(
    runtime: Any, llama_image_id: str, model_repo_dir: Path, tmp_path: Path
) -> None:
    """A GGUF cut short (as a broken copy would be) is refused by llama.cpp before it listens."""
    recipe = load_recipe(RECIPE)
    good = next((model_repo_dir / "snapshots").glob("*/*.gguf"))
    bad_repo = tmp_path / "repo"
    snapshot = bad_repo / good.parent.relative_to(model_repo_dir)
    snapshot.mkdir(parents=True)
    with good.open("rb") as src:
        (snapshot / good.name).write_bytes(src.read(10_000_000))
    port = find_free_port()
    spec = _spec(recipe, llama_image_id, bad_repo, port, f"anvil-test-llama-bad-{uuid.uuid4().hex[:10]}")
    container_id = runtime.create(spec)
    try:
        runtime.start(container_id)
        deadline = time.monotonic() + 60
        info = runtime.inspect(container_id)
        while info.running and time.monotonic() < deadline:
            time.sleep(0.1)
            info = runtime.inspect(container_id)
        assert not info.running, "a container with a truncated model kept running"
        logs = _logs(runtime, container_id)
    finally:
        with contextlib.suppress(NotFound):
            runtime.remove(container_id, force=True)
    assert info.exit_code == 1
    fatal = [
        line
        for line in logs.splitlines()
        if "error loading model" in line or "failed to load model" in line or line.startswith("ValueError")
    ]
    assert any(line.startswith("llama_model_load: error loading model:") for line in fatal), logs[-2000:]
    assert "llama_model_load_from_file_impl: failed to load model" in fatal
    assert any(line.startswith("ValueError: Failed to load model from file:") for line in fatal)
    # The log audit, with the engine profile's patterns, finds llama.cpp's own fatal lines.
    lines = logs.splitlines()
    found = classify(lines, patterns_of(LLAMA_CPP_PYTHON), keep=len(lines)).fatal
    assert set(fatal) <= {str(f["text"]) for f in found}
    REPORT["corrupt_model_fatal_lines"] = fatal
