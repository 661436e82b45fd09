"""The real-engine host, shared by `make demo-real` and tests/integration/test_llama_lifecycle.py.

Inside the hermetic test environment (`scripts/testenv run -- ...`, which loads the llama.cpp
engine image and exports ANVIL_LLAMA_IMAGE_ID and ANVIL_MODEL_CACHE): a real HAProxy on
127.0.0.1 whose checks GET the engine profile's check path (/docs: llama.cpp has no /health,
and its /v1/models waits behind a running completion), its client key in a 0600
credential file, a host config whose model_cache_dir is the verified SmolLM2 cache, and a
llama.cpp incumbent at 2,048 tokens started by hand from recipes/llama-smollm2-2k.toml and
routed as `llm.primary`: what an operator had before anvil_ctl.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.credentials import resolve_credentials
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.config.host import load_host_config
from anvil_ctl.core.engine_profile import LLAMA_CPP_PYTHON
from anvil_ctl.core.model import Readmission
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.recipes.spec import container_spec
from scripts.routers import Proc, start_haproxy

TIER, ALIAS = "primary-local", "llm.primary"
INCUMBENT_RECIPE, CANDIDATE_RECIPE = "llama-smollm2-2k", "llama-smollm2-8k"
INCUMBENT_MODEL, CANDIDATE_MODEL = "smollm2-135m-q4_1", "smollm2-135m-q4_1-8k"
BINDING = "127.0.0.1:8001"

HOST_TOML = """\
host = "{host}"
model_cache_dir = "{cache}"

{roles}[slots.primary]
binding = "{binding}"
router_tier = "{tier}"
aliases = ["{alias}"]
{slot_extra}
[router]
kind = "haproxy"
url = "{router_url}"
runtime_socket = "{socket}"
credential_file = "{cred}"
readmit_deadline_s = 120

[policy]
stop_timeout_s = 10
health_poll_s = 0.2
{policy_extra}"""
"""The host config of a llama.cpp host behind HAProxy (`scripts/gpu_story.py` adds GPU roles)."""


@dataclass
class LlamaHost:
    work: Path
    haproxy: Proc
    client_token: str
    model_cache: Path
    incumbent_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @property
    def cred(self) -> Path:
        return self.work / "router-credentials.toml"

    @property
    def config(self) -> Path:
        return self.work / "anvil.toml"

    def write_config(
        self,
        path: Path,
        *,
        cache: Path | None = None,
        host: str = "anvil-llama",
        roles: str = "",
        slot_extra: str = "",
        policy_extra: str = "",
    ) -> Path:
        path.write_text(
            HOST_TOML.format(
                host=host,
                roles=roles,
                slot_extra=slot_extra,
                policy_extra=policy_extra,
                cache=cache or self.model_cache,
                binding=BINDING,
                tier=TIER,
                alias=ALIAS,
                router_url=self.haproxy.url,
                socket=self.haproxy.extra["socket"],
                cred=self.cred,
            )
        )
        return path

    def anvilctl(
        self, *args: str, env: dict[str, str] | None = None, echo: bool = False, timeout_s: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "anvil_ctl", *args]
        r = subprocess.run(cmd, env=env or self.env, text=True, capture_output=True, timeout=timeout_s)
        self.log.append(f"$ anvilctl {' '.join(args)}\n{r.stdout}{r.stderr}(exit {r.returncode})\n")
        if echo:
            print(f"$ anvilctl {' '.join(args)}", flush=True)
            sys.stdout.write(r.stdout)
            for line in r.stderr.splitlines():
                if not line.startswith("{"):
                    print(line)
            print(f"(exit {r.returncode})", flush=True)
        return r

    def anvilctl_json(self, *args: str) -> Any:
        r = self.anvilctl("--json", *args)
        return json.loads(r.stdout)

    def stop(self) -> None:
        self.haproxy.stop()


def open_llama_host(
    work: Path, model_cache: Path, *, health_path: str, recipes_dir: Path, gpu: str
) -> LlamaHost:
    """HAProxy whose checks GET `health_path`, its client key in a 0600 file, the commands' env."""
    client = secrets.token_urlsafe(24)
    haproxy = start_haproxy(
        workdir=work / "routers", tiers={TIER: (ALIAS,)}, client_token=client, health_path=health_path
    )
    host = LlamaHost(work=work, haproxy=haproxy, client_token=client, model_cache=model_cache)
    fd = os.open(host.cred, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f'client_token = "{client}"\n')
    host.env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_ROUTER_")} | {
        "ANVIL_CONFIG": str(host.config),
        "ANVIL_STATE_DIR": str(work / "state"),
        "ANVIL_RECIPES_DIR": str(recipes_dir),
        "ANVIL_GPU": gpu,
        "ANVIL_LOG_FORMAT": "json",
        "ANVIL_LOG_LEVEL": "info",
        "HOME": str(work / "home"),
    }
    return host


def start_llama_host(work: Path, model_cache: Path) -> LlamaHost:
    """A fresh `work`: HAProxy, its client key and the host config, for the CPU llama.cpp engine."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # llama.cpp has no /health, and its /v1/models waits behind a running completion.
    check = LLAMA_CPP_PYTHON.check_path
    host = open_llama_host(
        work, model_cache, health_path=check, recipes_dir=REPO / "recipes", gpu="simulated"
    )
    host.write_config(host.config)
    return host


def wait_listed(url: str, served: str, timeout_s: float = 120) -> float:
    """Seconds until GET url/v1/models lists `served` (the engine loads before it listens)."""
    import httpx

    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            r = httpx.get(url + "/v1/models", timeout=2)
            if r.status_code == 200 and served in [m.get("id") for m in r.json().get("data", [])]:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not list {served!r} within {timeout_s}s")


def start_by_hand(
    host: LlamaHost,
    recipe_path: Path,
    *,
    name: str,
    served_model: str,
    runtime: DockerRuntime,
    timeout_s: float,
) -> str:
    """A serve of `recipe_path` started by hand and routed as llm.primary (what an operator had)."""
    config = load_host_config(host.config)
    spec = container_spec(
        load_recipe(recipe_path),
        slot_name="primary",
        slot=config.slots["primary"],
        host_config=config,
        recipe_path=recipe_path,
        tx_id="by-hand",
    )
    labels = dict(spec.labels) | {"io.anvil.role": "incumbent", "io.anvil.binding": BINDING}
    spec = replace(spec, name=name, labels=tuple(sorted(labels.items())))
    cid = runtime.create(spec)
    runtime.start(cid)
    wait_listed(f"http://{BINDING}", served_model, timeout_s)
    creds = resolve_credentials(config.router, {}, need_admin=False)
    with HaproxyRouter(
        host.haproxy.url, Path(host.haproxy.extra["socket"]), creds, {TIER: (ALIAS,)}
    ) as router:
        # llama.cpp answers with the request's model: a routed answer by alias says the alias.
        router.readmit(Readmission(TIER, f"http://{BINDING}", (ALIAS,), ALIAS, 120))
    host.incumbent_id = cid
    return cid


def start_incumbent_by_hand(host: LlamaHost) -> str:
    """The 2,048-token llama.cpp serve started by hand and routed as llm.primary."""
    runtime = DockerRuntime(gpu_mode="simulated")
    try:
        recipe = REPO / "recipes" / f"{INCUMBENT_RECIPE}.toml"
        name = "llama-smollm2-2k-by-hand"
        return start_by_hand(
            host, recipe, name=name, served_model=INCUMBENT_MODEL, runtime=runtime, timeout_s=120
        )
    finally:
        runtime.close()


def container_logs(container_id: str, *, timestamps: bool = False) -> str:
    """The container's log (stdout and stderr), as `docker logs` gives it."""
    runtime = DockerRuntime(gpu_mode="simulated")
    try:
        raw: bytes = runtime._client.api.logs(container_id, timestamps=timestamps)
    finally:
        runtime.close()
    return raw.decode(errors="replace")


def container_status(container_id: str) -> tuple[str, int | None]:
    runtime = DockerRuntime(gpu_mode="simulated")
    try:
        info = runtime.inspect(container_id)
    finally:
        runtime.close()
    return info.status, info.exit_code


def routed_curl(host: LlamaHost, content: str, *, max_tokens: int = 16) -> tuple[int, dict[str, Any]]:
    """One chat through the router with plain curl and the client key (from a 0600 file,
    never on the command line)."""
    body = json.dumps(
        {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    )
    headers = host.work / "curl-headers"
    fd = os.open(headers, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"Authorization: Bearer {host.client_token}\nContent-Type: application/json\n")
    try:
        r = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "300",
                "-H",
                f"@{headers}",
                "-w",
                "\n%{http_code}",
                "--data-binary",
                body,
                f"{host.haproxy.url}/v1/chat/completions",
            ],
            text=True,
            capture_output=True,
            timeout=320,
        )
    finally:
        headers.unlink(missing_ok=True)
    text, _, status = r.stdout.rpartition("\n")
    try:
        data = json.loads(text)
    except ValueError:
        data = {"raw": text[:300], "stderr": r.stderr[:300]}
    return int(status or 0), data


def requests_served(container_id: str) -> int:
    """How many chat completions the engine's access log shows (uvicorn's lines)."""
    return sum(1 for line in container_logs(container_id).splitlines() if "POST /v1/chat/completions" in line)
