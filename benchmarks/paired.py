"""Paired benchmark: anvilctl against the bare sequence of the same parts, on the same containers.

Run inside the hermetic environment (real dockerd, real smg, stub engines in containers):

    scripts/testenv run -- .venv/bin/python benchmarks/paired.py [--reps 3] [--json OUT]

One campaign host (scripts/campaign.py: smg with keys in a 0600 file, simulated GPUs, a
stub incumbent started by hand, routed and adopted). Each repetition runs the anvilctl
cycle and the bare cycle back to back, alternating which goes first, each from the same
state (the incumbent serving and routed) back to it:

- load: `anvilctl load stub-393k-c1` | drain the tier, stop the incumbent gracefully, create
  and start the candidate, poll /health and /v1/models;
- promote, gates excluded (a verified decision is recorded directly, untimed):
  `anvilctl promote` | register the worker, wait until listed and healthy, routed smoke,
  then the three acceptance requests (plain, streamed, tool call) through the official
  `openai` client in an interpreter of their own, as an operator's script would send them
  (issue 31: the bare promote pays the interpreter start and the client that acceptance must
  use, as anvilctl's promote does);
- rollback: `anvilctl rollback` | drain the tier, stop the candidate gracefully, start the
  incumbent's same container ID, poll /health and /v1/models, register, routed smoke.

Both sides do the drain the product does: workers registered with
`health.drain_settle_secs = 0` (smg removes a DELETEd one at once, no fixed removal wait),
DELETE and wait until unlisted, then wait until the engine's running-requests gauge
(`stub:num_requests_running`, the stub profile's drain source) reads zero; the stop is
`docker stop` with the profile's stop timeout. anvilctl also parks the alias at its parking
responder for the window (clients get 503, not 404): that, its records and its checks are
what the ratios price.

The bare sequence is written plainly: the Docker SDK and one httpx client, in this
process (no interpreter start, no imports, no records), polling every 50 ms; only promote's
acceptance runs in a child interpreter (`BARE_ACCEPTANCE`). Its chats send
anvilctl's own request bodies (the readmission prompt and max_tokens of
`router_http.routed_chat`; the prompts, max_tokens and tool of `anvil_ctl.acceptance`): the stub
decodes what it is asked for (recipes run it with `--verbose-default`: a prompt it has no
answer for gets `max_tokens`, else 256, tokens at 1,000 tok/s), so a bare chat of another
prompt would time the stub's decoding, not the sequence (until 2026-12-03 the bare smoke
"smoke" took 0.27 s to anvilctl's 0.02 s).
Also: `anvilctl --help` against `python -c pass` (same interpreter), and the own time of
`status` and `recheck` (their wall time minus the time spent waiting on Docker and HTTP
calls, measured by benchmarks/owntime.py). On a loaded machine read the ratios.

The own time is split in two: after each timed run, a process that only imports the
third-party packages that run imported (the top-level names owntime.py found in its
`sys.modules`, so computed, never listed here) and exits as anvilctl does is timed too;
that is the libraries' floor (interpreter start included), and own time minus it is ours.
`--own-only` runs just that table (no load/promote/rollback cycles, no `--help` series).

The package's bytecode is compiled first, as `pip install` does: a checkout whose environment
sets PYTHONDONTWRITEBYTECODE (this machine's does) never writes its .pyc files, and every
anvilctl process would otherwise compile ~90 of its modules again (0.12-0.23 s each, measured
with cProfile: `compile` inside `source_to_code`). An installed anvilctl never pays that.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import docker
import httpx

from anvil_ctl.acceptance import PLAIN_PROMPT, STREAM_PROMPT, TOOL_PROMPT, TOOLS
from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.router_http import READMIT_PROMPT
from anvil_ctl.bootstrap import App
from anvil_ctl.config.host import load_host_config
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.recipes.model import load_recipe
from anvil_ctl.recipes.spec import container_spec
from scripts.campaign import (
    Campaign,
    reserve_waiver,
    start_campaign,
    start_incumbent_by_hand,
    verified_decision,
)
from scripts.routers import exit_on_sigterm

SLOT, TIER, ALIAS, URL = "primary", "primary-local", "llm.primary", "http://127.0.0.1:8001"
RECIPE = "stub-393k-c1"
CANDIDATE_MODEL = "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp"
INCUMBENT_MODEL = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
POLL_S = 0.05
RUNNING_METRIC = engine_profile("stub").running_metric
STOP_TIMEOUT_S = engine_profile("stub").stop_timeout_s
ANVILCTL = str(Path(sys.executable).with_name("anvilctl"))

OWN_TARGET_S = 0.5  # status and recheck, beyond their Docker and HTTP calls

BARE_ACCEPTANCE = """
import json, os, sys
import openai

url, alias, model, plain, stream, tool, tools = json.loads(sys.argv[1])
client = openai.OpenAI(base_url=url + "/v1", api_key=os.environ["BARE_KEY"], max_retries=0)
reply = client.chat.completions.create(
    model=alias, messages=[{"role": "user", "content": plain}], max_tokens=64
)
assert reply.model == model and reply.choices[0].message.content, reply
finished = [
    c.choices[0].finish_reason
    for c in client.chat.completions.create(
        model=alias, messages=[{"role": "user", "content": stream}], max_tokens=64, stream=True
    )
    if c.choices and c.choices[0].finish_reason
]
assert finished, "the stream ended without a finish_reason"
reply = client.chat.completions.create(
    model=alias, messages=[{"role": "user", "content": tool}], tools=tools, max_tokens=256
)
assert reply.model == model and reply.choices[0].message.tool_calls, reply
"""
"""The bare promote's acceptance: the same three requests as `anvil_ctl.acceptance` (plain,
streamed, tool call; same prompts, max_tokens and tool), sent by the official `openai` client in
a fresh interpreter, each answer checked; the key travels in the environment, never argv."""

TARGETS = {
    "load": 1.2,
    "promote (gates excluded)": 1.5,
    "rollback": 1.15,
    "`--help` / `python -c pass`": 3.0,
}


@dataclass
class Series:
    """Paired samples of one measure: anvilctl seconds and bare seconds."""

    name: str
    anvil: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    anvil_cpu: list[float] = field(default_factory=list)
    """CPU seconds (user + system) of each anvilctl run and the children it waited for (the
    acceptance worker): steadier than its wall time on a loaded machine."""

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.anvil, self.bare, strict=True)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "anvil_s": self.anvil,
            "bare_s": self.bare,
            "ratios": self.ratios,
            "anvil_cpu_s": self.anvil_cpu,
        }


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


# -- the bare sequence ------------------------------------------------------------------------


class Bare:
    """The same parts, plainly: the Docker SDK and HTTP calls, no journal, no checks."""

    def __init__(self, camp: Campaign) -> None:
        self.admin = {"Authorization": f"Bearer {camp.admin_token}"}
        self.client_token = camp.client_token
        self.client = {"Authorization": f"Bearer {camp.client_token}"}
        self.smg = camp.router.url
        self.http = httpx.Client(timeout=30)
        self.docker = docker.from_env()
        host = load_host_config(camp.work / "anvil.toml")
        path = REPO / "recipes" / f"{RECIPE}.toml"
        self.make_spec = lambda tx: container_spec(
            load_recipe(path),
            slot_name=SLOT,
            slot=host.slots[SLOT],
            host_config=host,
            recipe_path=path,
            tx_id=tx,
        )
        # Only the translation of a spec into the SDK's create call is borrowed (untimed).
        self.runtime = DockerRuntime(gpu_mode="simulated")

    def close(self) -> None:
        self.http.close()
        self.docker.close()
        self.runtime.close()

    def workers(self) -> list[dict[str, Any]]:
        body = self.http.get(f"{self.smg}/workers", headers=self.admin).json()
        return [w for w in body["workers"] if (w.get("labels") or {}).get("anvil.tier") == TIER]

    def drain(self) -> None:
        """Out of traffic, then idle: DELETE the tier's workers (registered with no settle
        time, smg removes them at once), wait until unlisted, then until the engine's own
        gauge reads zero requests in flight."""
        for w in self.workers():
            self.http.delete(f"{self.smg}/workers/{w['id']}", headers=self.admin)
        while self.workers():
            time.sleep(POLL_S)
        while self.running() != 0:
            time.sleep(POLL_S)

    def running(self) -> int | None:
        """The stub's running-requests gauge (the drain's source for this engine profile)."""
        try:
            text = self.http.get(f"{URL}/metrics").text
        except httpx.TransportError:
            return None
        values = [line.split()[-1] for line in text.splitlines() if line.startswith(RUNNING_METRIC)]
        return round(sum(float(v) for v in values)) if values else None

    def stop(self, container: str) -> None:
        """The graceful stop: the engine's stop signal, the profile's stop timeout."""
        self.docker.api.stop(container, timeout=int(STOP_TIMEOUT_S))

    def register(self, model: str) -> None:
        body = {
            "url": URL,
            "models": [{"id": ALIAS}],
            "labels": {"anvil.tier": TIER},
            "health": {"drain_settle_secs": 0},
        }
        self.http.post(f"{self.smg}/workers", headers=self.admin, json=body)
        while not any(w.get("is_healthy") for w in self.workers()):
            time.sleep(POLL_S)
        smoke = {"messages": [{"role": "user", "content": READMIT_PROMPT}], "max_tokens": 64, "stream": False}
        while self.chat(smoke).get("model") != model:
            time.sleep(POLL_S)

    def chat(self, extra: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post(
            f"{self.smg}/v1/chat/completions", headers=self.client, json={"model": ALIAS, **extra}
        )
        return dict(r.json()) if r.status_code == 200 else {}

    def serving(self, model: str) -> None:
        while True:
            try:
                healthy = self.http.get(f"{URL}/health").status_code == 200
                models = (
                    [m["id"] for m in self.http.get(f"{URL}/v1/models").json()["data"]] if healthy else []
                )
                if models == [model]:
                    return
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(POLL_S)

    # -- the three sequences, each timed --

    def load(self, incumbent: str) -> tuple[float, str]:
        spec = self.make_spec(f"bare-{uuid.uuid4().hex[:8]}")
        started = time.perf_counter()
        self.drain()
        self.stop(incumbent)
        candidate = self.runtime.create(spec)
        self.docker.api.start(candidate)
        self.serving(CANDIDATE_MODEL)
        return time.perf_counter() - started, candidate

    def promote(self) -> float:
        started = time.perf_counter()
        self.register(CANDIDATE_MODEL)
        self.acceptance(CANDIDATE_MODEL)
        return time.perf_counter() - started

    def acceptance(self, model: str) -> None:
        """The three checks of real-client acceptance, in an interpreter of their own."""
        ask = [self.smg, ALIAS, model, PLAIN_PROMPT, STREAM_PROMPT, TOOL_PROMPT, TOOLS]
        r = subprocess.run(
            [sys.executable, "-c", BARE_ACCEPTANCE, json.dumps(ask)],
            env={**os.environ, "BARE_KEY": self.client_token},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise SystemExit(f"bare acceptance failed:\n{r.stderr[-3000:]}")

    def rollback(self, candidate: str, incumbent: str) -> float:
        started = time.perf_counter()
        self.drain()
        self.stop(candidate)
        self.docker.api.start(incumbent)
        self.serving(INCUMBENT_MODEL)
        self.register(INCUMBENT_MODEL)
        return time.perf_counter() - started


# -- anvilctl ---------------------------------------------------------------------------------


def anvilctl(camp: Campaign, *args: str) -> float:
    started = time.perf_counter()
    r = subprocess.run([ANVILCTL, *args], env=camp.env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if r.returncode != 0:
        raise SystemExit(f"anvilctl {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}")
    return seconds


def verified(camp: Campaign) -> None:
    """Record a verified decision for the loaded candidate: promote without running the gates."""
    settings = Settings(state_dir=camp.work / "state", config=camp.work / "anvil.toml", _env_file=None)  # type: ignore[call-arg]
    app = App(settings=settings, env={})
    verified_decision(app.store, SLOT, f"bench-{uuid.uuid4()}")
    app.database.dispose()


CPU_OF_LAST_CYCLE: list[float] = []
"""The CPU seconds of the last anvil_cycle's three commands (load, promote, rollback)."""


def anvil_cycle(camp: Campaign) -> tuple[float, float, float]:
    cpu = [children_cpu_s()]
    load = anvilctl(camp, "load", RECIPE, "--slot", SLOT)
    cpu.append(children_cpu_s())
    verified(camp)
    cpu.append(children_cpu_s())
    promote = anvilctl(camp, "promote", "--slot", SLOT, "--approved-by", "bench")
    cpu.append(children_cpu_s())
    rollback = anvilctl(camp, "rollback", "--slot", SLOT)
    cpu.append(children_cpu_s())
    CPU_OF_LAST_CYCLE[:] = [cpu[1] - cpu[0], cpu[3] - cpu[2], cpu[4] - cpu[3]]
    return load, promote, rollback


def bare_cycle(bare: Bare, incumbent: str) -> tuple[float, float, float]:
    load, candidate = bare.load(incumbent)
    promote = bare.promote()
    rollback = bare.rollback(candidate, incumbent)
    return load, promote, rollback


# -- process-level measures -------------------------------------------------------------------


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - started


def children_cpu_s() -> float:
    """User + system CPU seconds of the children this process has waited for, so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def own_time(camp: Campaign, *args: str) -> tuple[float, float, float, list[str]]:
    """(wall s, s waiting on Docker and HTTP, CPU s, the third-party packages it imported) of
    one `anvilctl ARGS`."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cpu = children_cpu_s()
        started = time.perf_counter()
        r = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "owntime.py"), out.name, *args],
            env=camp.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.perf_counter() - started
        cpu = children_cpu_s() - cpu
        if r.returncode != 0:
            raise SystemExit(f"anvilctl {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
        noted = json.loads(Path(out.name).read_text())
    return seconds, float(noted["io_s"]), cpu, list(noted["libraries"])


def library_floor(camp: Campaign, libraries: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of a process that imports only `libraries` and exits as anvilctl does."""
    cpu = children_cpu_s()
    seconds = wall([sys.executable, str(REPO / "benchmarks" / "owntime.py"), "--floor", *libraries], camp.env)
    return seconds, children_cpu_s() - cpu


def own_times(camp: Campaign, reps: int) -> dict[str, dict[str, Any]]:
    """status and recheck: wall, Docker + HTTP, own, and the libraries' floor after each run;
    the CPU seconds of both processes too (steadier than wall time on a loaded machine)."""
    own: dict[str, dict[str, Any]] = {}
    for name, args in (("status", ("status",)), ("recheck", ("recheck", "--slot", SLOT))):
        m: dict[str, Any] = {
            k: [] for k in ("wall_s", "io_s", "own_s", "floor_s", "beyond_s", "beyond_cpu_s")
        }
        for _ in range(max(reps, 3)):
            seconds, io, cpu, libraries = own_time(camp, *args)
            floor, floor_cpu = library_floor(camp, libraries)
            m["wall_s"].append(seconds)
            m["io_s"].append(io)
            m["own_s"].append(seconds - io)
            m["floor_s"].append(floor)
            m["beyond_s"].append(seconds - io - floor)
            m["beyond_cpu_s"].append(cpu - floor_cpu)
            m["libraries"] = libraries
        own[name] = m
    return own


# -- main -------------------------------------------------------------------------------------


def run(reps: int, work: Path, *, own_only: bool = False) -> dict[str, Any]:
    camp = start_campaign(work)
    bare: Bare | None = None
    try:
        anvilctl(camp, "init")
        incumbent = start_incumbent_by_hand(camp)
        anvilctl(camp, "adopt", incumbent, "--slot", SLOT, "--context-tokens", "524288")
        anvilctl(camp, *reserve_waiver("bench"))  # else promote's VRAM-after-acceptance refuses
        if own_only:
            return {
                "reps": reps,
                "series": [],
                "own_time": own_times(camp, reps),
                "load_avg": os.getloadavg(),
            }
        bare = Bare(camp)
        print("warm-up: one anvilctl cycle and one bare cycle (untimed)", flush=True)
        anvil_cycle(camp)
        bare_cycle(bare, incumbent)
        series = {name: Series(name) for name in ("load", "promote (gates excluded)", "rollback")}
        for rep in range(reps):
            order = ("anvil", "bare") if rep % 2 == 0 else ("bare", "anvil")
            got: dict[str, tuple[float, float, float]] = {}
            for who in order:
                got[who] = anvil_cycle(camp) if who == "anvil" else bare_cycle(bare, incumbent)
            for i, s in enumerate(series.values()):
                s.anvil.append(got["anvil"][i])
                s.bare.append(got["bare"][i])
                s.anvil_cpu.append(CPU_OF_LAST_CYCLE[i])
            print(
                f"rep {rep + 1}: "
                + ", ".join(f"{s.name} {s.anvil[-1]:.2f}/{s.bare[-1]:.2f} s" for s in series.values()),
                flush=True,
            )
        helps = Series("`--help` / `python -c pass`")
        for _ in range(max(reps, 5)):
            helps.anvil.append(wall([ANVILCTL, "--help"], camp.env))
            helps.bare.append(wall([sys.executable, "-c", "pass"], camp.env))
        return {
            "reps": reps,
            "series": [s.as_dict() for s in (*series.values(), helps)],
            "own_time": own_times(camp, reps),
            "load_avg": os.getloadavg(),
        }
    finally:
        if bare is not None:
            bare.close()
        camp.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['reps']} paired repetitions (alternating order); load average at the end "
        f"{result['load_avg'][0]:.1f} / {result['load_avg'][1]:.1f} / {result['load_avg'][2]:.1f}.",
    ]
    if result["series"]:
        lines += [
            "",
            "| measure | anvilctl s (min / med / max) | bare s (min / med / max) "
            "| ratio (min / med / max) | target |",
            "|---|---|---|---|---|",
        ]
    for s in result["series"]:
        target = TARGETS.get(s["name"])
        met = statistics.median(s["ratios"]) <= target if target is not None else None
        verdict = f"<= {target}" + {None: "", True: " ok", False: " **not met**"}[met]
        lines.append(
            f"| {s['name']} | {spread(s['anvil_s'])} | {spread(s['bare_s'], '{:.3f}')} | "
            f"{spread(s['ratios'])} | {verdict} |"
        )
    cpu = [s for s in result["series"] if s.get("anvil_cpu_s")]
    if cpu:
        lines += [
            "",
            "| measure | anvilctl CPU s, user + system (min / med / max) |",
            "|---|---|",
            *(f"| {s['name']} | {spread(s['anvil_cpu_s'])} |" for s in cpu),
        ]
    lines += [
        "",
        "Own time is wall time minus the time spent waiting on Docker and HTTP calls. The "
        "libraries' floor is a process that starts, imports only the third-party packages that "
        "run imported, and exits as anvilctl does, timed right after each run; own time minus "
        "it is anvilctl's own (its modules, its work, and any library submodule it loads "
        "beyond the packages' own imports). The last column is the same difference in CPU "
        "seconds (user + system) of the two processes, which a loaded machine disturbs less.",
        "",
        "| command | wall s (min / med / max) | waiting on Docker + HTTP s "
        "| own s (min / med / max) | libraries' floor s | own beyond the floor s | target "
        "| beyond the floor, CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in result["own_time"].items():
        own = statistics.median(m["own_s"])
        beyond = statistics.median(m["beyond_s"])
        verdict = (
            f"<= {OWN_TARGET_S}: own {'ok' if own <= OWN_TARGET_S else '**not met**'}, "
            f"beyond the floor {'ok' if beyond <= OWN_TARGET_S else '**not met**'}"
        )
        lines.append(
            f"| `{name}` | {spread(m['wall_s'])} | {spread(m['io_s'])} | {spread(m['own_s'])} "
            f"| {spread(m['floor_s'])} | {spread(m['beyond_s'])} | {verdict} "
            f"| {spread(m['beyond_cpu_s'])} |"
        )
    for name, m in result["own_time"].items():
        lines += ["", f"Third-party packages `{name}` imported: {', '.join(m['libraries'])}."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="paired repetitions (at least 3)")
    parser.add_argument(
        "--own-only", action="store_true", help="only the own-time table of status and recheck"
    )
    parser.add_argument("--json", type=Path, help="also write the samples here")
    parser.add_argument("--markdown-out", type=Path, help="also write the tables here (make bench)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "anvil-bench-paired")
    args = parser.parse_args()
    if not os.environ.get("ANVIL_TESTENV"):
        print(
            "run inside the hermetic environment: "
            "scripts/testenv run -- .venv/bin/python benchmarks/paired.py"
        )
        return 2
    exit_on_sigterm()
    # What an installed package has (pip compiles at install); see the module docstring.
    compileall.compile_dir(REPO / "anvil_ctl", quiet=1)
    result = run(max(args.reps, 3), args.work, own_only=args.own_only)
    print()
    print(markdown(result))
    if args.markdown_out:
        args.markdown_out.write_text(markdown(result) + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
