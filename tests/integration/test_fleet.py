"""A fleet on the test environment's PostgreSQL: two hosts, two test environments.

Host A (`gpu-a`) is the test environment the tests run in; host B (`gpu-b`) is a second one
started beside it (`tests/integration/second_env.py`: `scripts/testenv up` from inside the
first, its own network namespace and dockerd, no PostgreSQL server of its own). Each host
has its own state directory, anvil.toml and machine id, its own HAProxy router and stub
engines in its own dockerd, and the same slot layout as the other (`primary` on
127.0.0.1:8001: each has a loopback of its own). Both share one PostgreSQL database, host B
through the first env's server's unix socket. Host B's commands run inside its env
(`scripts/testenv exec DIR -- ...`).

Both run load, promote and rollback at the same time and both commit. While host A's load
holds A's host lock, a second mutator on host A is refused (exit 3, naming the owner's host
and pid) and writes nothing; the first one still commits. `fleet status` shows both;
`audit verify --full --all-hosts` is clean; the serving history answers which container
served llm.primary on host B at a time T (a container of B's dockerd that A's does not have).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anvil_ctl.adapters.credentials import resolve_credentials
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.bootstrap import App
from anvil_ctl.config.host import load_host_config
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.model import Readmission
from anvil_ctl.engine.lock import held_locks
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.recipes.spec import container_spec
from scripts.campaign import reserve_waiver, verified_decision
from scripts.routers import Proc, start_haproxy
from tests.integration import second_env
from tests.integration.second_env import SecondEnv, in_netns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INCUMBENT_MODEL = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
MUTATIONS = ("load", "promote", "rollback")
SLOT, PORT = "primary", 8001  # on each host: each has its own loopback
HOLD_AT = "load:start-candidate:do:intent"
"""Host A's load pauses right after this journal row commits (ANVIL_PAUSE_AT: it waits until
its state directory's `paused-at` file is removed), holding A's host lock for as long as the
test needs to try a second mutator of host A, however slow the machine."""

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


def _recipe(src: str, dest: Path, name: str) -> None:
    text = (REPO / "recipes" / f"{src}.toml").read_text()
    text = text.replace(f'name = "{src}"', f'name = "{name}"')
    text = text.replace('"../anvil_', f'"{REPO}/anvil_')
    (dest / f"{name}.toml").write_text(text)


@dataclass
class FleetHost:
    name: str
    work: Path
    haproxy: Proc
    env_b: SecondEnv | None = None
    """Host B's test environment; None for host A (the environment the test runs in)."""
    env: dict[str, str] = field(default_factory=dict)
    incumbent_id: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def prefix(self) -> list[str]:
        return self.env_b.prefix if self.env_b else []

    def inside(self) -> AbstractContextManager[None]:
        """This thread inside the host's network namespace (its loopback, its router)."""
        return in_netns(self.env_b.netns) if self.env_b else nullcontext()

    def runtime(self) -> DockerRuntime:
        """The host's own Docker Engine."""
        return DockerRuntime(base_url=self.env["DOCKER_HOST"], gpu_mode="simulated")

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, sys.executable, "-m", "anvil_ctl", *args]

    def anvilctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(self.argv(*args), env=self.env, text=True, capture_output=True, timeout=600)
        self.log.append(
            f"$ anvilctl {' '.join(args)} -> {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
        )
        return r

    def json(self, *args: str) -> object:
        r = self.anvilctl("--json", *args)
        assert r.returncode == 0, self.log[-1]
        return json.loads(r.stdout)

    def app(self) -> App:
        settings = Settings(  # type: ignore[call-arg]
            state_dir=Path(self.env["ANVIL_STATE_DIR"]),
            state_db=self.env["ANVIL_STATE_DB"],
            config=Path(self.env["ANVIL_CONFIG"]),
            recipes_dir=Path(self.env["ANVIL_RECIPES_DIR"]),
            gpu="simulated",
            machine_id_file=Path(self.env["ANVIL_MACHINE_ID_FILE"]),
            _env_file=None,
        )
        return App(settings=settings, env=self.env)

    def verify_candidate(self) -> None:
        """A verified decision for the loaded candidate (promote's precondition; qualify is
        not what this test is about)."""
        app = self.app()
        verified_decision(app.store, SLOT, f"fleet-{self.name}-{{digest}}")


def _start_host(
    root: Path, name: str, n: int, db_url: str, started: list[FleetHost], env_b: SecondEnv | None = None
) -> FleetHost:
    work = root / name
    (work / "recipes").mkdir(parents=True)
    client = secrets.token_urlsafe(24)
    host_env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_ROUTER_")}
    if env_b is not None:
        host_env |= env_b.env  # its DOCKER_HOST, netns, stub image
    with in_netns(env_b.netns) if env_b else nullcontext():
        proxy = start_haproxy(
            workdir=work / "routers", tiers={f"{SLOT}-local": (f"llm.{SLOT}",)}, client_token=client
        )
    host = FleetHost(name, work, proxy, env_b)
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
            slot=SLOT,
            port=PORT,
            router_url=proxy.url,
            socket=proxy.extra["socket"],
            cred=cred,
        )
    )
    (work / "machine-id").write_text(f"{n}" * 32 + "\n")
    _recipe("stub-incumbent-524k", work / "recipes", f"inc-{name}")
    _recipe("stub-393k-c1", work / "recipes", f"cand-{name}")
    host.env = host_env | {
        "ANVIL_CONFIG": str(config),
        "ANVIL_STATE_DIR": str(work / "state"),
        "ANVIL_STATE_DB": db_url,
        "ANVIL_RECIPES_DIR": str(work / "recipes"),
        "ANVIL_MACHINE_ID_FILE": str(work / "machine-id"),
        "ANVIL_GPU": "simulated",
        "ANVIL_LOG_FORMAT": "json",
    }
    assert host.anvilctl("init").returncode == 0, host.log[-1]
    # what the operator had before: a serve started by hand on the host's engine, routed
    cfg = load_host_config(config)
    recipe_path = work / "recipes" / f"inc-{name}.toml"
    spec = container_spec(
        load_recipe(recipe_path),
        slot_name=SLOT,
        slot=cfg.slots[SLOT],
        host_config=cfg,
        recipe_path=recipe_path,
        tx_id="by-hand",
    )
    labels = dict(spec.labels) | {"io.anvil.role": "incumbent", "io.anvil.binding": f"127.0.0.1:{PORT}"}
    spec = replace(spec, name=f"fleet-incumbent-{name}", labels=tuple(sorted(labels.items())))
    runtime = host.runtime()
    try:
        host.incumbent_id = runtime.create(spec)
        runtime.start(host.incumbent_id)
    finally:
        runtime.close()
    with (
        host.inside(),
        HaproxyRouter(
            proxy.url,
            Path(proxy.extra["socket"]),
            resolve_credentials(cfg.router, {}, need_admin=False),
            {f"{SLOT}-local": (f"llm.{SLOT}",)},
        ) as router,
    ):
        router.readmit(
            Readmission(f"{SLOT}-local", f"http://127.0.0.1:{PORT}", (f"llm.{SLOT}",), INCUMBENT_MODEL, 120)
        )
    r = host.anvilctl("adopt", host.incumbent_id, "--slot", SLOT, "--context-tokens", "524288")
    assert r.returncode == 0, host.log[-1]
    r = host.anvilctl(*reserve_waiver("fleet-test"))
    assert r.returncode == 0, host.log[-1]
    return host


def _teardown(started: list[FleetHost]) -> None:
    """Each host's containers (all of its own engine's: the incumbent and what anvilctl made),
    by ID; its router, by PID."""
    for h in started:
        try:
            runtime = h.runtime()
            try:
                mine = {c.id for c in runtime.list(labels={"io.anvil.host": h.name})} | {h.incumbent_id}
                for cid in sorted(mine - {""}):
                    runtime.remove(cid, force=True)
            finally:
                runtime.close()
        finally:
            h.haproxy.stop()


@pytest.fixture
def fleet(tmp_path: Path, pg_database: Callable[..., str]) -> Iterator[tuple[FleetHost, FleetHost]]:
    url = pg_database(migrated=False)
    starting = second_env.start(tmp_path / "testenv-b.log")  # comes up while host A is set up
    env_b: SecondEnv | None = None
    started: list[FleetHost] = []
    try:
        a = _start_host(tmp_path, "gpu-a", 1, url, started)
        env_b = starting.wait()
        b = _start_host(tmp_path, "gpu-b", 2, url, started, env_b)
        yield a, b
    finally:
        try:
            _teardown(started)
        finally:
            if env_b is not None:
                env_b.down()
            else:
                starting.abandon()


def _load_refusing_a_rival(host: FleetHost) -> subprocess.CompletedProcess[str]:
    """Host A's load; while it holds A's host lock (paused inside its transaction, its lock row
    written), a second mutator of A (another load) is tried and must be refused."""
    args = ("load", f"cand-{host.name}", "--slot", SLOT)
    paused = host.work / "state" / "paused-at"
    holder = subprocess.Popen(
        host.argv(*args),
        env=host.env | {"ANVIL_PAUSE_AT": HOLD_AT},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not paused.exists():
            assert holder.poll() is None, f"load ended ({holder.returncode}) before it paused at {HOLD_AT}"
            assert time.monotonic() < deadline, f"the load did not reach {HOLD_AT} within 120 s"
            time.sleep(0.05)
        store = host.app().store
        assert {lk.pid for lk in held_locks(store)} == {holder.pid}  # the load holds the lock
        rival = host.anvilctl(*args)
        assert rival.returncode == 3, host.log[-1]
        assert "another mutator holds this host" in rival.stderr, host.log[-1]
        assert f"pid {holder.pid} on {host.name}" in rival.stderr, host.log[-1]
        # the rival wrote no lock row: the only one held is still the load's
        assert {lk.pid for lk in held_locks(store)} == {holder.pid}
        paused.unlink()
        out, err = holder.communicate(timeout=300)
    finally:
        paused.unlink(missing_ok=True)
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    host.log.append(f"$ anvilctl {' '.join(args)} -> {holder.returncode}\n{out[-2000:]}{err[-4000:]}")
    return subprocess.CompletedProcess(holder.args, holder.returncode, out, err)


def _cycle(host: FleetHost, marks: dict[str, str], failures: list[str]) -> None:
    """load, promote, rollback on one host; a mark of the time between promote and rollback."""
    try:
        for step in ("load", "promote", "rollback"):
            if step == "load":
                if host.env_b is None:
                    r = _load_refusing_a_rival(host)
                else:
                    r = host.anvilctl("load", f"cand-{host.name}", "--slot", SLOT)
            elif step == "promote":
                host.verify_candidate()
                r = host.anvilctl("promote", "--slot", SLOT, "--approved-by", "fleet-test")
                marks[host.name] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            else:
                r = host.anvilctl("rollback", "--slot", SLOT)
            if r.returncode != 0:
                failures.append(host.log[-1])
                return
    except Exception as exc:  # a thread's failure is reported by the test, not lost
        failures.append(f"{host.name}: {type(exc).__name__}: {exc}\n" + "\n".join(host.log[-3:]))


class TestFleetOnPostgres:
    def test_two_hosts_in_two_environments_load_promote_rollback_at_once_and_the_fleet_answers_for_both(
        self, fleet: tuple[FleetHost, FleetHost]
    ) -> None:
        a, b = fleet
        # two engines: each host's incumbent is a container of its own dockerd only
        for h, other in ((a, b), (b, a)):
            rt = h.runtime()
            try:
                ids = {c.id for c in rt.list()}
            finally:
                rt.close()
            assert h.incumbent_id in ids and other.incumbent_id not in ids
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
            # one of each, all committed: the refused second mutator of A left no transaction
            mutations = [(t["host"], t["kind"], t["state"]) for t in txs if t["kind"] in MUTATIONS]
            assert sorted(mutations) == sorted((h.name, kind, "committed") for kind in MUTATIONS), txs
            assert h.json("lock", "status") == []
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

        # which container served llm.primary on host B between its promote and its rollback:
        # its promoted candidate (a container of B's engine), asked from host A
        cand_a = a.app().store.current_identity(SLOT, "candidate")
        cand_b = b.app().store.current_identity(SLOT, "candidate")
        assert cand_a is not None and cand_b is not None
        served = a.json("audit", "served", "--slot", SLOT, "--at", marks["gpu-b"], "--host", "gpu-b")
        assert isinstance(served, list)
        assert [(s["host"], s["container_id"]) for s in served] == [("gpu-b", cand_b.container_id)]
        rt_b = b.runtime()
        try:
            assert cand_b.container_id in {c.id for c in rt_b.list()}
        finally:
            rt_b.close()
        everyone = a.json("audit", "served", "--slot", SLOT, "--at", marks["gpu-a"], "--all-hosts")
        assert isinstance(everyone, list)
        by_host = {s["host"]: s["container_id"] for s in everyone}
        assert by_host["gpu-a"] == cand_a.container_id
        # host B served primary too at that time: its incumbent or its candidate
        assert by_host.get("gpu-b") in {b.incumbent_id, cand_b.container_id}, everyone
