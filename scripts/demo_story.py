"""`make demo`, run inside the hermetic test environment (scripts/testenv run -- ...).

A stub incumbent serves `llm.primary` through a real smg router on 127.0.0.1;
anvilctl adopts it, loads a stub candidate from a pinned recipe on the real
Docker Engine (the incumbent stopped and retained), then shows `status` and the
audit trail. GPUs are simulated (ANVIL_GPU=simulated): there is no GPU here.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.docker_runtime import DockerRuntime  # noqa: E402
from anvil_ctl.config import load_host_config  # noqa: E402
from anvil_ctl.recipes import container_spec, load_recipe  # noqa: E402
from scripts.routers import start_smg  # noqa: E402

HOST_TOML = """\
host = "anvil-demo"

[gpu_roles.compute-a]
uuid = "GPU-00000000-0000-4000-8000-00000000000a"
capacity_mib = 97887

[gpu_roles.compute-b]
uuid = "GPU-00000000-0000-4000-8000-00000000000b"
capacity_mib = 97887

[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]
gpu_roles = ["compute-a", "compute-b"]

[router]
kind = "smg"
url = "{router_url}"
credential_file = "{cred}"
readmit_deadline_s = 90

[policy]
vram_release_deadline_s = 30
stop_timeout_s = 10
"""


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def anvilctl(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    print("$ anvilctl " + " ".join(args), flush=True)
    r = subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args], env=env, text=True, capture_output=True
    )
    sys.stdout.write(r.stdout)
    if r.stderr.strip():
        sys.stdout.write("".join(line + "\n" for line in r.stderr.splitlines() if "error" in line))
    print(f"(exit {r.returncode})", flush=True)
    if check and r.returncode != 0:
        raise SystemExit(f"demo: `anvilctl {' '.join(args)}` exited {r.returncode}:\n{r.stderr}")
    return r


def main() -> int:
    work = REPO / "state" / "demo"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    admin, client = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    cred = work / "router-credentials.toml"
    fd = os.open(cred, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f'admin_token = "{admin}"\nclient_token = "{client}"\n')

    banner("start a real smg router on 127.0.0.1 (keys from a private file)")
    smg = start_smg(workdir=work / "routers", admin_token=admin, client_token=client)
    print(f"smg pid {smg.pid} at {smg.url}")
    try:
        (work / "anvil.toml").write_text(HOST_TOML.format(router_url=smg.url, cred=cred))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_ROUTER_")} | {
            "ANVIL_CONFIG": str(work / "anvil.toml"),
            "ANVIL_STATE_DIR": str(work / "state"),
            "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
            "ANVIL_GPU": "simulated",
            "ANVIL_LOG_FORMAT": "json",
            "ANVIL_LOG_LEVEL": "warning",
        }
        anvilctl(env, "init")

        banner("the incumbent: a stub EXL3-like serve started by hand, then adopted")
        host = load_host_config(work / "anvil.toml")
        recipe_path = REPO / "recipes" / "stub-incumbent-524k.toml"
        spec = container_spec(
            load_recipe(recipe_path),
            slot_name="primary",
            slot=host.slots["primary"],
            host_config=host,
            recipe_path=recipe_path,
            tx_id="by-hand",
        )
        labels = dict(spec.labels) | {
            "io.anvil.role": "incumbent",
            "io.anvil.binding": "127.0.0.1:8001",
        }
        from dataclasses import replace

        spec = replace(spec, name="incumbent-524k", labels=tuple(labels.items()))
        runtime = DockerRuntime(gpu_mode="simulated")
        inc = runtime.create(spec)
        runtime.start(inc)
        print(f"incumbent container {inc[:12]} started")
        from anvil_ctl.adapters.credentials import resolve_credentials
        from anvil_ctl.adapters.smg import SmgRouter

        router = SmgRouter(smg.url, resolve_credentials(host.router, {}))
        router.readmit(
            "primary-local",
            "http://127.0.0.1:8001",
            ("llm.primary",),
            "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix",
            90,
        )
        print("router: llm.primary -> incumbent, routed chat 200")
        anvilctl(env, "adopt", inc, "--slot", "primary", "--context-tokens", "524288")

        banner("load the 393K candidate (dry run first)")
        anvilctl(env, "load", "stub-393k-c1", "--slot", "primary", "--dry-run")
        anvilctl(env, "load", "stub-393k-c1", "--slot", "primary")
        print(f"incumbent {inc[:12]} is now: {runtime.inspect(inc).status} (retained, same ID)")

        banner("status")
        anvilctl(env, "status")
        banner("audit trail")
        anvilctl(env, "audit", "transactions")
        tx = json.loads(anvilctl(env, "--json", "audit", "transactions", "--kind", "load").stdout)[
            0
        ]
        anvilctl(env, "audit", "show", tx["tx_id"])
        anvilctl(env, "audit", "verify")
        print("\ndemo: done. State is in", work)
    finally:
        smg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
