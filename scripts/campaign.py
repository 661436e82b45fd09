"""The seed campaign's host, shared by `make demo`, the end-to-end tests and the benchmarks.

Sets up, inside the hermetic test environment: a real router on 127.0.0.1 (smg with admin
and client keys, or HAProxy with its client key and a 0600 Runtime API socket) with its
keys in a 0600 credential file, a host config with simulated GPUs (two
97,887 MiB cards, as in the seeds), a stub EXL3-like incumbent started by hand
from `recipes/stub-incumbent-524k.toml`, routed as `llm.primary`, and adopted; two more
slots for the arms of the matched A/B control.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.credentials import resolve_credentials
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.adapters.smg import SmgRouter
from anvil_ctl.config.host import load_host_config
from anvil_ctl.core.model import Readmission
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.store import Store
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.recipes.spec import container_spec
from scripts.routers import Proc, start_haproxy, start_smg

INCUMBENT_MODEL = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"

HOST_TOML = """\
host = "anvil-campaign"

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

# Two slots for the arms of the matched A/B control (stub-131k-nospec, stub-131k-mtp): both
# serve at once, on no GPU role, never routed.
[slots.ab-nospec]
binding = "127.0.0.1:8011"
router_tier = "ab-nospec-local"
aliases = ["llm.ab-nospec"]

[slots.ab-mtp]
binding = "127.0.0.1:8012"
router_tier = "ab-mtp-local"
aliases = ["llm.ab-mtp"]

[router]
kind = "{router_kind}"
url = "{router_url}"
{router_lines}
readmit_deadline_s = 120

[policy]
vram_reserve_mib = 3072
vram_release_deadline_s = 30
stop_timeout_s = 10

[restore_groups]
# The seeds' first restore attempt chose a split group without the declared rollback identity.
split-compute-a = ["0000000000000000"]
"""


ROUTER_KINDS = ("smg", "haproxy")


@dataclass
class Campaign:
    work: Path
    router: Proc
    """The router process: smg, or HAProxy (its Runtime API socket in `router.extra`)."""
    admin_token: str
    client_token: str
    router_kind: str = "smg"
    incumbent_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @property
    def cred(self) -> Path:
        return self.work / "router-credentials.toml"

    def write_config(self, path: Path, *, with_credentials: bool = True) -> Path:
        lines = [f'credential_file = "{self.cred}"'] if with_credentials else []
        if self.router_kind == "haproxy":
            lines.append(f'runtime_socket = "{self.router.extra["socket"]}"')
        if "metrics_url" in self.router.extra:  # smg's Prometheus page: its per-worker failures
            lines.append(f'metrics_url = "{self.router.extra["metrics_url"]}"')
        text = HOST_TOML.format(
            router_kind=self.router_kind, router_url=self.router.url, router_lines="\n".join(lines)
        )
        path.write_text(text)
        return path

    def anvilctl(
        self, *args: str, env: dict[str, str] | None = None, echo: bool = False
    ) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "anvil_ctl", *args]
        if not echo:
            r = subprocess.run(cmd, env=env or self.env, text=True, capture_output=True, timeout=600)
            self.log.append(f"$ anvilctl {' '.join(args)}\n{r.stdout}{r.stderr}(exit {r.returncode})\n")
            return r
        # Echoed (the demo): the command line first, its progress lines (stderr, plain and
        # timestamped on a pipe) as they arrive, then its result, so the screen is never dark.
        print(f"$ anvilctl {' '.join(args)}", flush=True)
        err: list[str] = []
        started = last = time.monotonic()
        finished = threading.Event()

        def relay(stream: Any) -> None:
            nonlocal last
            for line in iter(stream.readline, ""):
                err.append(line)
                if not line.startswith("{"):  # JSON log lines stay in the log only
                    print(line, end="", flush=True)
                    last = time.monotonic()

        def watchdog() -> None:
            # A command with no progress of its own (init, recheck) still shows it is running.
            nonlocal last
            while not finished.wait(0.25):
                if time.monotonic() - last >= 2.0:
                    print(
                        f"  ... anvilctl {args[0]} still running ({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
                    last = time.monotonic()

        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()

        with subprocess.Popen(
            cmd, env=env or self.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            reader = threading.Thread(target=relay, args=(proc.stderr,), daemon=True)
            reader.start()
            assert proc.stdout is not None
            out = proc.stdout.read()
            code = proc.wait(timeout=600)
            reader.join(timeout=60)
        finished.set()
        dog.join()
        sys.stdout.write(out)
        print(f"(exit {code})", flush=True)
        self.log.append(f"$ anvilctl {' '.join(args)}\n{out}{''.join(err)}(exit {code})\n")
        return subprocess.CompletedProcess(cmd, code, out, "".join(err))

    def stop(self) -> None:
        self.router.stop()

    def restart_router(self) -> None:
        """The router SIGKILLed and started again on its port: every registration lost."""
        port = int(self.router.url.rsplit(":", 1)[1])
        self.router.kill()
        self.router = start_router(self.router_kind, self.work, self.admin_token, self.client_token, port)

    def router_client(self) -> HaproxyRouter | SmgRouter:
        """The router adapter for the campaign's host config (close it when done)."""
        host = load_host_config(self.work / "anvil.toml")
        if self.router_kind == "haproxy":
            creds = resolve_credentials(host.router, {}, need_admin=False)
            return HaproxyRouter(self.router.url, Path(self.router.extra["socket"]), creds, TIERS)
        return SmgRouter(self.router.url, resolve_credentials(host.router, {}))


# The host config's tiers and their aliases (HAProxy's config is rendered from them).
TIERS = {
    "primary-local": ("llm.primary",),
    "ab-nospec-local": ("llm.ab-nospec",),
    "ab-mtp-local": ("llm.ab-mtp",),
}


def start_router(kind: str, work: Path, admin_token: str, client_token: str, port: int | None = None) -> Proc:
    """A fresh router process of `kind` (no registration) on `port` or a free one."""
    workdir = work / "routers"
    if kind == "haproxy":
        return start_haproxy(workdir=workdir, tiers=TIERS, client_token=client_token, port=port)
    return start_smg(workdir=workdir, admin_token=admin_token, client_token=client_token, port=port)


def start_campaign(work: Path, router: str = "smg") -> Campaign:
    """The campaign host on a fresh router of kind `router` (smg or haproxy)."""
    if router not in ROUTER_KINDS:
        raise ValueError(f"router {router!r}: expected one of {ROUTER_KINDS}")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    admin = secrets.token_urlsafe(24) if router == "smg" else ""
    client = secrets.token_urlsafe(24)
    camp = Campaign(
        work=work,
        router=start_router(router, work, admin, client),
        admin_token=admin,
        client_token=client,
        router_kind=router,
    )
    fd = os.open(camp.cred, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        if admin:
            fh.write(f'admin_token = "{admin}"\n')
        fh.write(f'client_token = "{client}"\n')
    camp.write_config(work / "anvil.toml")
    camp.env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_ROUTER_")} | {
        "ANVIL_CONFIG": str(work / "anvil.toml"),
        "ANVIL_STATE_DIR": str(work / "state"),
        "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
        "ANVIL_GPU": "simulated",
        "ANVIL_LOG_FORMAT": "json",
        "ANVIL_LOG_LEVEL": "info",
        "HOME": str(work / "home"),
    }
    return camp


@contextmanager
def ticking(what: str, every_s: float = 2.0) -> Iterator[None]:
    """Say `what` now, and `... still <what> (N s)` every `every_s` seconds until the block ends:
    a demo step without progress of its own never leaves the screen dark for long."""
    print(what, flush=True)
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            print(f"  ... still {what.split(': ', 1)[-1]} ({time.monotonic() - started:.0f} s)", flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def verified_decision(
    store: Store, slot: str, decision_id: str, *, profile: str = "", waiver_ids: tuple[str, ...] = ()
) -> None:
    """Record a verified decision for `slot`'s loaded candidate, what a passing `qualify`
    records: for the tests and harnesses about promote, which qualify is not. `decision_id`
    may hold `{digest}`, the first 12 characters of the candidate's qualification digest;
    `profile` names the profile it was qualified by (its `[watch]` table is the promote's);
    `waiver_ids` the gate waivers it relied on."""
    cand = store.current_identity(slot, "candidate")
    assert cand is not None, f"slot {slot} has no candidate"
    qualification.record_decision(
        store,
        decision_id=decision_id.format(digest=cand.qualification_digest[:12]),
        tx_id=None,
        slot=slot,
        identity_digest=cand.qualification_digest,
        container_id=cand.container_id,
        outcome="verified",
        profile=profile,
        waiver_ids=waiver_ids,
    )


def reserve_waiver(
    approved_by: str, reason: str = "model-only GPU pair", *, days: int | None = 30
) -> list[str]:
    """`anvilctl waive` arguments for the seeds' waiver: the standing 3,072 MiB/card reserve
    waived to 0 for the model-only pair compute-a,compute-b (without it promote's
    VRAM-after-acceptance step refuses the 393k candidate: 2,101 MiB free). `days=None`: no expiry."""
    expiry = (
        ["--no-expiry"]
        if days is None
        else ["--expires", (datetime.now(UTC) + timedelta(days=days)).date().isoformat()]
    )
    return [
        "waive",
        "--policy",
        "vram-reserve",
        "--scope",
        "compute-a,compute-b",
        "--value",
        "0",
        "--approved-by",
        approved_by,
        "--reason",
        reason,
        *expiry,
    ]


def start_incumbent_by_hand(camp: Campaign) -> str:
    """What the operator had before anvil_ctl: a serve started by hand, routed as llm.primary."""
    host = load_host_config(camp.work / "anvil.toml")
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
    spec = replace(spec, name="exl3-k3-dflash2-k5-524k", labels=tuple(sorted(labels.items())))
    runtime = DockerRuntime(gpu_mode="simulated")
    cid = runtime.create(spec)
    runtime.start(cid)
    with (
        camp.router_client() as router,
        ticking(f"by hand: waiting for {camp.router_kind} to readmit the incumbent (deadline 120 s)"),
    ):
        router.readmit(
            Readmission("primary-local", "http://127.0.0.1:8001", ("llm.primary",), INCUMBENT_MODEL, 120)
        )
    runtime.close()
    camp.incumbent_id = cid
    return cid


def runtime() -> Any:
    """A Docker runtime on the test environment's engine (close it when done)."""
    return DockerRuntime(gpu_mode="simulated")


def publish_claims(bundle: Path, path: Path) -> Path:
    """The demo's publication: two public numbers read from the exported bundle, written as a
    claims file bound to their artifacts (what `anvilctl claims check` recounts)."""
    import json

    capacity_file = next(bundle.glob("*-capacity.json"))
    reserve_file = next(bundle.glob("*-vram_reserve.json"))
    cells = json.loads(capacity_file.read_text())["evidence"]["cells"]
    cell = next(c for c in cells if c["nominal_tokens"] == 4096 and c["concurrency"] == 1)
    free = json.loads(reserve_file.read_text())["evidence"]["cards"][0]["free_mib"]
    decode, prompt = f"{cell['decode_tps_p50']:.2f}", f"{cell['prompt_tokens_p50']:,.0f}"
    where = "evidence.cells[nominal_tokens=4096,concurrency=1]"
    path.write_text(
        f"""\
title = "Stub 393K/C1 promotion (make demo)"
finding = "demo finding"

[[claims]]
claim = "{decode} decode tok/s"
published = "{decode}"
conditions = "{prompt} prompt tokens; C1; p50 of three"
artifact = "{capacity_file.name}"
path = "{where}.decode_tps_p50"

  [[claims.condition]]
  published = "{prompt}"
  path = "{where}.prompt_tokens_p50"

[[claims]]
claim = "{free:,} MiB/card free after qualification"
published = "{free:,}"
conditions = "after the complete workload; standing reserve 3,072 MiB/card, waived to 0 for the pair"
artifact = "{reserve_file.name}"
path = "evidence.cards[0].free_mib"

[[claims]]
claim = "roughly 8,100 tok/s prefill upstream"
origin = "external-prior"
conditions = "upstream stable release, native Linux"
source = "the recipe source's upstream release report"
"""
    )
    return path
