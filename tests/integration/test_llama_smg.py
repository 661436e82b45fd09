"""smg 1.13.0 cannot route to llama-cpp-python 0.3.36, and says why: recorded as a test.

smg's worker registration runs a `detect_connection_mode` step that GETs `<worker>/health`
whatever `--health-check-endpoint` or `--disable-health-check` say; llama-cpp-python has no
such route (404), so the worker never appears in `GET /workers` and a routed chat answers
404 `model_not_found`. HAProxy (checks configurable per backend: GET /v1/models) is the
router of this engine in the tests (test_llama_lifecycle.py). Should a later smg register
the worker, this test fails and says so: then smg can route llama.cpp too.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.config.host import load_host_config
from anvil_ctl.core.errors import NotFound
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.recipes.spec import container_spec
from scripts.llama_host import BINDING, INCUMBENT_MODEL, INCUMBENT_RECIPE, REPO, wait_listed
from scripts.routers import start_smg

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _need(name: str) -> str:
    value = os.environ.get(name)
    if value:
        return value
    reason = f"{name} is not set: run inside scripts/testenv after make llama-wheel llama-model llama-image"
    if os.environ.get("ANVIL_REQUIRE_INTEGRATION") == "1":
        pytest.fail(reason + " [ANVIL_REQUIRE_INTEGRATION=1]", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[str]:
    """The 2,048-token llama.cpp serve on the slot binding, ready; removed by ID afterwards."""
    _need("ANVIL_LLAMA_IMAGE_ID")
    cache = _need("ANVIL_MODEL_CACHE")
    (tmp_path / "anvil.toml").write_text(
        f'model_cache_dir = "{cache}"\n[slots.primary]\nbinding = "{BINDING}"\n'
        'router_tier = "primary-local"\naliases = ["llm.primary"]\n[router]\nkind = "none"\n'
    )
    config = load_host_config(tmp_path / "anvil.toml")
    recipe_path = REPO / "recipes" / f"{INCUMBENT_RECIPE}.toml"
    spec = container_spec(
        load_recipe(recipe_path),
        slot_name="primary",
        slot=config.slots["primary"],
        host_config=config,
        recipe_path=recipe_path,
        tx_id="smg-test",
    )
    runtime = DockerRuntime(gpu_mode="simulated")
    cid = runtime.create(replace(spec, name=f"anvil-test-smg-llama-{secrets.token_hex(4)}"))
    try:
        runtime.start(cid)
        wait_listed(f"http://{BINDING}", INCUMBENT_MODEL)
        yield cid
    finally:
        with contextlib.suppress(NotFound):
            runtime.remove(cid, force=True)
        runtime.close()


@pytest.mark.parametrize(
    "smg_args",
    [["--health-check-endpoint", "/v1/models"], ["--disable-health-check"]],
    ids=["health-check-endpoint", "disable-health-check"],
)
def test_smg_never_registers_a_llama_cpp_worker_because_it_probes_health(
    llama: str, tmp_path: Path, smg_args: list[str]
) -> None:
    admin, client = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    smg = start_smg(workdir=tmp_path / "smg", admin_token=admin, client_token=client, extra_args=smg_args)
    try:
        headers = {"Authorization": f"Bearer {admin}"}
        body = {"url": f"http://{BINDING}", "models": [{"id": "llm.primary"}], "labels": {"anvil.tier": "t"}}
        posted = httpx.post(smg.url + "/workers", json=body, headers=headers, timeout=10)
        assert posted.status_code == 202, posted.text  # accepted for background registration
        deadline = time.monotonic() + 15
        log = ""
        while time.monotonic() < deadline:
            log = ANSI.sub("", smg.log_path.read_text(errors="replace"))
            if log.count("detect_connection_mode - http health check failed") >= 3:
                break
            time.sleep(0.5)
        workers = httpx.get(smg.url + "/workers", headers=headers, timeout=10).json()["workers"]
        assert workers == [], "smg registered the llama.cpp worker: smg can route it now"
        assert (
            f"http health check failed for explicitly configured worker URL http://{BINDING}: Health check "
            f"failed: HTTP status client error (404 Not Found) for url (http://{BINDING}/health)"
        ) in log
        chat = httpx.post(
            smg.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {client}"},
            json={"model": "llm.primary", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        )
        assert chat.status_code == 404
        assert chat.json()["error"]["code"] == "model_not_found"
    finally:
        smg.stop()
