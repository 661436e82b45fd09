"""A fleet on the test environment's PostgreSQL: two hosts, load/promote/rollback at once.

Two hosts (`gpu-a`, `gpu-b`): two state directories and anvil.toml, two machine ids, two
HAProxy routers, each its own stub engines in the environment's dockerd, one PostgreSQL
state database. Both run load, promote and rollback at the same time and both commit;
`fleet status` shows both; `audit verify --full --all-hosts` is clean; the serving
history answers which container served a slot on host B at a time T.

The two hosts share one dockerd here (real hosts each have their own): each host's
runtime labels what it creates with its name and lists only its own containers (and
unlabelled ones), the incumbents started by hand carry their host's label, the slots are
bound to different ports (`primary` on 127.0.0.1:8001 for gpu-a, `second` on
127.0.0.1:8002 for gpu-b) and the simulated GPUs have different UUIDs.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anvil_ctl.adapters.credentials import resolve_credentials
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.bootstrap import Context
from anvil_ctl.config import Settings, load_host_config
from anvil_ctl.persistence import qualification
from anvil_ctl.recipes import container_spec, load_recipe
from scripts.campaign import reserve_waiver
from scripts.routers import Proc, start_haproxy

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INCUMBENT_MODEL = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"

HOST_TOML = """\
[host]
name = "{name}"

[gpu_roles.compute-a]
uuid = "GPU-00000000-0000-4000-8000-0000000000{n}a"
capacity_mib = 97887
[gpu_roles.compute-b]
uuid = "GPU-00000000-0000-4000-8000-0000000000{n}b"
capacity_mib = 97887

[slots.{slot}]
binding = "127.0.0.1:{port}"
router_tier = "{slot}-local"
aliases = ["llm.{slot}"]
gpu_roles = ["compute-a", "compute-b"]

[router]
kind = "haproxy"
url = "{router_url}"
runtime_socket = "{socket}"
credential_file = "{cred}"

[policy]
stop_timeout_s = 5
vram_release_deadline_s = 20
health_poll_s = 0.1
"""


def _recipe(src: str, dest: Path, name: str, port: int) -> None:
    text = (REPO / "recipes" / f"{src}.toml").read_text()
    text = text.replace(f'name = "{src}"', f'name = "{name}"')
    text = text.replace("port = 8001", f"port = {port}").replace('"--port", "8001"', f'"--port", "{port}"')
    text = text.replace('"../anvil_ctl/', f'"{REPO}/anvil_ctl/')
    (dest / f"{name}.toml").write_text(text)


@dataclass
class FleetHost:
    name: str
    slot: str
    port: int
    work: Path
    haproxy: Proc
    env: dict[str, str] = field(default_factory=dict)
    incumbent_id: str = ""
    log: list[str] = field(default_factory=list)

    def anvilctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", *args],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=600,
        )
        self.log.append(
            f"$ anvilctl {' '.join(args)} -> {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
        )
        return r

    def json(self, *args: str) -> object:
        r = self.anvilctl("--json", *args)
        assert r.returncode == 0, self.log[-1]
        return json.loads(r.stdout)

    def context(self) -> Context:
        settings = Settings(  # type: ignore[call-arg]
            state_dir=Path(self.env["ANVIL_STATE_DIR"]),
            state_db=self.env["ANVIL_STATE_DB"],
            config=Path(self.env["ANVIL_CONFIG"]),
            recipes_dir=Path(self.env["ANVIL_RECIPES_DIR"]),
            gpu="simulated",
            machine_id_file=Path(self.env["ANVIL_MACHINE_ID_FILE"]),
            _env_file=None,
        )
        return Context(settings=settings, env=self.env)

    def verify_candidate(self) -> None:
        """A verified decision for the loaded candidate (promote's precondition; qualify is
        not what this test is about)."""
        ctx = self.context()
        cand = ctx.store.current_identity(self.slot, "candidate")
        assert cand is not None
        qualification.record_decision(
            ctx.store,
            decision_id=f"fleet-{self.name}-{cand.qualification_digest[:12]}",
            tx_id=None,
            slot=self.slot,
            identity_digest=cand.qualification_digest,
            container_id=cand.container_id,
            outcome="verified",
        )


def _start_host(
    root: Path, name: str, n: int, slot: str, port: int, db_url: str, started: list[FleetHost]
) -> FleetHost:
    work = root / name
    (work / "recipes").mkdir(parents=True)
    client = secrets.token_urlsafe(24)
    proxy = start_haproxy(
        workdir=work / "routers", tiers={f"{slot}-local": (f"llm.{slot}",)}, client_token=client
    )
    host = FleetHost(name, slot, port, work, proxy)
    started.append(host)  # its router is stopped at teardown whatever happens next
    cred = work / "router-credentials.toml"
    fd = os.open(cred, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f'client_token = "{client}"\n')
    config = work / "anvil.toml"
    config.write_text(
        HOST_TOML.format(
            name=name,
            n=n,
            slot=slot,
            port=port,
            router_url=proxy.url,
            socket=proxy.extra["socket"],
            cred=cred,
        )
    )
    (work / "machine-id").write_text(f"{n}" * 32 + "\n")
    _recipe("stub-incumbent-524k", work / "recipes", f"inc-{name}", port)
    _recipe("stub-393k-c1", work / "recipes", f"cand-{name}", port)
    host.env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_ROUTER_")} | {
        "ANVIL_CONFIG": str(config),
        "ANVIL_STATE_DIR": str(work / "state"),
        "ANVIL_STATE_DB": db_url,
        "ANVIL_RECIPES_DIR": str(work / "recipes"),
        "ANVIL_MACHINE_ID_FILE": str(work / "machine-id"),
        "ANVIL_GPU": "simulated",
        "ANVIL_LOG_FORMAT": "json",
    }
    assert host.anvilctl("init").returncode == 0, host.log[-1]
    # what the operator had before: a serve started by hand, routed
    cfg = load_host_config(config)
    recipe_path = work / "recipes" / f"inc-{name}.toml"
    spec = container_spec(
        load_recipe(recipe_path),
        slot_name=slot,
        slot=cfg.slots[slot],
        host_config=cfg,
        recipe_path=recipe_path,
        tx_id="by-hand",
    )
    labels = dict(spec.labels) | {
        "io.anvil.role": "incumbent",
        "io.anvil.binding": f"127.0.0.1:{port}",
        # on its host's own Docker Engine, as it were (see the module doc)
        "io.anvil.host": name,
    }
    spec = replace(spec, name=f"fleet-incumbent-{name}", labels=tuple(sorted(labels.items())))
    runtime = DockerRuntime(gpu_mode="simulated")
    try:
        host.incumbent_id = runtime.create(spec)
        runtime.start(host.incumbent_id)
    finally:
        runtime.close()
    with HaproxyRouter(
        proxy.url,
        Path(proxy.extra["socket"]),
        resolve_credentials(cfg.router, {}, need_admin=False),
        {f"{slot}-local": (f"llm.{slot}",)},
    ) as router:
        router.readmit(f"{slot}-local", f"http://127.0.0.1:{port}", (f"llm.{slot}",), INCUMBENT_MODEL, 120)
    r = host.anvilctl("adopt", host.incumbent_id, "--slot", slot, "--context-tokens", "524288")
    assert r.returncode == 0, host.log[-1]
    r = host.anvilctl(*reserve_waiver("fleet-test"))
    assert r.returncode == 0, host.log[-1]
    return host


@pytest.fixture
def fleet(tmp_path: Path, pg_database: Callable[..., str]) -> Iterator[tuple[FleetHost, FleetHost]]:
    url = pg_database(migrated=False)
    started: list[FleetHost] = []
    try:
        a = _start_host(tmp_path, "gpu-a", 1, "primary", 8001, url, started)
        b = _start_host(tmp_path, "gpu-b", 2, "second", 8002, url, started)
        yield a, b
    finally:
        runtime = DockerRuntime(gpu_mode="simulated")
        try:
            # ours only, by ID: what each host created (labelled with its name) and its incumbent
            ours = {h.incumbent_id for h in started if h.incumbent_id}
            for h in started:
                ours |= {c.id for c in runtime.list(labels={"io.anvil.host": h.name})}
            for cid in sorted(ours):
                runtime.remove(cid, force=True)
        finally:
            runtime.close()
        for h in started:
            h.haproxy.stop()


def _cycle(host: FleetHost, marks: dict[str, str], failures: list[str]) -> None:
    """load, promote, rollback on one host; a mark of the time between promote and rollback."""
    try:
        for step in ("load", "promote", "rollback"):
            if step == "load":
                r = host.anvilctl("load", f"cand-{host.name}", "--slot", host.slot)
            elif step == "promote":
                host.verify_candidate()
                r = host.anvilctl("promote", "--slot", host.slot, "--approved-by", "fleet-test")
                marks[host.name] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            else:
                r = host.anvilctl("rollback", "--slot", host.slot)
            if r.returncode != 0:
                failures.append(host.log[-1])
                return
    except Exception as exc:  # a thread's failure is reported by the test, not lost
        failures.append(f"{host.name}: {type(exc).__name__}: {exc}")


class TestFleetOnPostgres:
    def test_two_hosts_load_promote_rollback_at_once_and_the_fleet_answers_for_both(
        self, fleet: tuple[FleetHost, FleetHost]
    ) -> None:
        a, b = fleet
        marks: dict[str, str] = {}
        failures: list[str] = []
        threads = [threading.Thread(target=_cycle, args=(h, marks, failures)) for h in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        assert failures == [], "\n".join(failures)

        for h in (a, b):
            txs = h.json("audit", "transactions")
            assert isinstance(txs, list)
            assert {(t["host"], t["kind"], t["state"]) for t in txs} >= {
                (h.name, "load", "committed"),
                (h.name, "promote", "committed"),
                (h.name, "rollback", "committed"),
            }
        status = a.json("fleet", "status")
        assert isinstance(status, dict)
        hosts = {h["host"]: h for h in status["hosts"]}
        assert set(hosts) == {"gpu-a", "gpu-b"}
        for h in (a, b):  # rolled back: the adopted incumbent serves each slot again
            assert [s["incumbent"] for s in hosts[h.name]["slots"]] == [h.incumbent_id]
            assert hosts[h.name]["open_transactions"] == []

        verify = a.anvilctl("--json", "audit", "verify", "--full", "--all-hosts")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert [h["host"] for h in json.loads(verify.stdout)["hosts"]] == ["gpu-a", "gpu-b"]

        # which container served llm.second on host B between its promote and its rollback:
        # its promoted candidate, asked from host A
        cand_b = b.context().store.current_identity(b.slot, "candidate")
        assert cand_b is not None
        served = a.json("audit", "served", "--slot", "second", "--at", marks["gpu-b"], "--host", "gpu-b")
        assert isinstance(served, list)
        assert [(s["host"], s["container_id"]) for s in served] == [("gpu-b", cand_b.container_id)]
        everyone = a.json("audit", "served", "--slot", "primary", "--at", marks["gpu-a"], "--all-hosts")
        assert isinstance(everyone, list)
        assert [s["host"] for s in everyone] == ["gpu-a"]
