"""`promote --canary` with real tokens: two llama.cpp serves of SmolLM2-135M on the CPU, where
two serves fit by construction (neither holds a GPU role).

A real HAProxy routes `llm.primary` to the 2,048-token serve started by hand and adopted in
slot `primary`; the 8,192-token candidate is loaded in slot `primary-b` of the same tier (its
own binding, 127.0.0.1:8002) and recorded verified. The canary steps 50, 100 % with both
serves answering the same prompts each round, judged by absolute limits and a generous
TTFT ratio (two engines share two busy cores), runs a promote's real-client acceptance (the
tools gate waived: a 135M model calls no tools) and commits: the official client then gets
its answers from the candidate alone, the old incumbent is stopped and retained.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.bootstrap import App
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.errors import NotFound
from scripts.campaign import verified_decision
from scripts.llama_host import (
    ALIAS,
    CANDIDATE_MODEL,
    CANDIDATE_RECIPE,
    INCUMBENT_MODEL,
    REPO,
    LlamaHost,
    start_incumbent_by_hand,
    start_llama_host,
)
from tests.integration.test_llama_lifecycle import _need, ok

pytestmark = pytest.mark.integration

SECOND_SLOT = """
[slots.primary-b]
binding = "127.0.0.1:8002"
router_tier = "primary-local"
aliases = ["llm.primary"]
"""
WATCH = """
name = "canary-llama"
[[gates]]
type = "smoke"
[watch]
interval_s = 0.5
requests = 2
max_tokens = 8
consecutive = 2
[[watch.thresholds]]
metric = "error_rate"
max = 0
[[watch.thresholds]]
metric = "finish_reason_missing"
max = 0
[[watch.thresholds]]
metric = "ttft_p95_s"
max_ratio = 10
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[LlamaHost, dict[str, str], Path]]:
    _need("ANVIL_LLAMA_IMAGE_ID")
    cache = Path(_need("ANVIL_MODEL_CACHE"))
    h = start_llama_host(tmp_path / "host", cache)
    try:
        h.config.write_text(h.config.read_text() + SECOND_SLOT)
        recipes = tmp_path / "recipes"
        recipes.mkdir()
        src = (REPO / "recipes" / f"{CANDIDATE_RECIPE}.toml").read_text()
        src = src.replace(f'name = "{CANDIDATE_RECIPE}"', 'name = "llama-canary-b"')
        src = src.replace("port = 8001", "port = 8002").replace('"--port", "8001"', '"--port", "8002"')
        (recipes / "llama-canary-b.toml").write_text(src)
        (tmp_path / "watch.toml").write_text(WATCH)
        env = {**h.env, "ANVIL_RECIPES_DIR": str(recipes)}
        ok(h.anvilctl("init"))
        start_incumbent_by_hand(h)
        ok(
            h.anvilctl(
                "adopt",
                h.incumbent_id,
                "--slot",
                "primary",
                "--context-tokens",
                "2048",
                "--engine",
                "llama-cpp-python",
            )
        )
        ok(h.anvilctl("load", "llama-canary-b", "--slot", "primary-b", env=env))
        yield h, env, tmp_path / "watch.toml"
    finally:
        h.stop()
        runtime = DockerRuntime(gpu_mode="simulated")
        for info in runtime.list(labels={"io.anvil.managed": "true"}):
            with contextlib.suppress(NotFound):
                runtime.remove(info.id, force=True)
        runtime.close()


def test_a_canary_of_two_cpu_serves_commits_on_real_tokens(
    host: tuple[LlamaHost, dict[str, str], Path],
) -> None:
    h, env, watch = host
    settings = Settings(  # type: ignore[call-arg]
        state_dir=Path(env["ANVIL_STATE_DIR"]),
        config=Path(env["ANVIL_CONFIG"]),
        recipes_dir=Path(env["ANVIL_RECIPES_DIR"]),
        gpu="simulated",
        _env_file=None,
    )
    app = App(settings=settings, env=env)
    candidate = app.store.current_identity("primary-b", "candidate")
    assert candidate is not None
    # A 135M model calls no tools: its operator waives the tools gate, as in the lifecycle
    # story, and the canary's real-client acceptance then does not require the tool call.
    expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).date().isoformat()
    waived = h.anvilctl(
        "--json",
        "waive",
        "--policy",
        "gate",
        "--scope",
        candidate.recipe_digest,
        "--gates",
        "tools",
        "--approved-by",
        "ops",
        "--reason",
        "135M model: no tool calls",
        "--expires",
        expires,
        env=env,
    )
    assert waived.returncode == 0, waived.stderr[-2000:]
    waiver_id = json.loads(waived.stdout)["waiver"]["id"]
    verified_decision(app.store, "primary-b", "llama-canary-{digest}", waiver_ids=(waiver_id,))

    r = h.anvilctl(
        "--json",
        "promote",
        "--slot",
        "primary-b",
        "--canary",
        "50,100",
        "--step-watch",
        "2s",
        "--profile",
        str(watch),
        "--approved-by",
        "ops",
        env=env,
    )
    out: dict[str, Any] = json.loads(r.stdout)
    assert (r.returncode, out["state"]) == (0, "committed"), (out.get("reason"), r.stderr[-3000:])
    for share in (50, 100):
        step = out["results"][f"share-{share}"]
        assert step["verdict"] == "healthy"
        for rnd in step["rounds"]:
            for arm, model in (("incumbent", INCUMBENT_MODEL), ("candidate", CANDIDATE_MODEL)):
                answers = rnd[arm]["requests"]
                assert [a["ok"] for a in answers] == [True, True], answers
                assert all(a["finish_reason"] and a["ttft_s"] for a in answers), answers
                assert {a["model"] for a in answers} == {model}
    # A promote's own last steps, on the candidate alone in the tier.
    accepted = out["results"]["acceptance"]
    assert accepted["passed"] or set(accepted.get("waived", {})) == {"tool_call"}, accepted
    assert out["results"]["vram-after-acceptance"]["passed"] is True

    with openai.OpenAI(
        base_url=h.haproxy.url + "/v1", api_key=h.client_token, max_retries=0, timeout=120
    ) as client:
        answer = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
        )
    assert answer.choices[0].message.content
    now = app.store.current_identity("primary-b", "incumbent")
    rollback = app.store.current_identity("primary", "rollback")
    assert now is not None and now.container_id == candidate.container_id
    assert rollback is not None and rollback.container_id == h.incumbent_id
    runtime = DockerRuntime(gpu_mode="simulated")
    try:
        assert not runtime.inspect(h.incumbent_id).running
        assert runtime.inspect(candidate.container_id).running
    finally:
        runtime.close()
