#!/usr/bin/env python3
"""The whole lifecycle on a GPU: llama.cpp built for CUDA, in Docker, under anvilctl.

Run on a host with an NVIDIA GPU, its driver, Docker (with or without the NVIDIA Container
Toolkit: the adapter picks Docker's GPU request or the device nodes), HAProxy on PATH, the
CUDA engine image loaded (scripts/build_llama_cuda.py) and the SmolLM2 model cache
(scripts/fetch_model.py). It tells one story and checks it as it goes:

 1. GPU roles from NVML (`anvilctl gpus detect`); NVML against nvidia-smi.
 2. The VRAM need of each serve measured: the engine started alone at 2,048 and at 8,192
    tokens, a long prompt run through it, the card's used MiB read, then stopped, and the
    time until the card is back to its idle reading (polled every 5 ms) recorded. The
    recipes are written with those needs (`--recipes-out`), and the card's reserve is set so
    that it holds the candidate and nothing else: idle free - need(8k) - margin. With it the
    VRAM-release gate of load and rollback has to wait for the stopped serve's memory.
 3. A 2,048-token incumbent started by hand and routed by a real HAProxy; anvilctl adopts it
    (GPU ownership from NVML PIDs mapped to the container by cgroup).
 4. load the 8,192-token candidate: the incumbent stopped (kept), its VRAM release awaited.
 5. qualify with `real-gpu`: capacity on GPU tokens cross-checked against llama.cpp's own
    timing lines, the VRAM reserve after the workload, the log audit with the CUDA profile.
 6. An operator waives the gates a 135M model fails; promote with the official client's
    acceptance (and the VRAM reserve after it); curl and the openai client through HAProxy.
 7. rollback to the same incumbent container ID; recheck; audit verify; evidence export.

nvidia-smi runs beside it all the while (`--loop-ms 50`, each line with its own
timestamp). Every VRAM figure that the record holds (the release gate's readings, the
qualification's readings before and after the workload, the reading after acceptance,
`anvilctl gpus` after each step) is compared with the nvidia-smi samples taken while that
record was written: nearest in time, within 1 MiB.

    python3 scripts/gpu_story.py --image-id sha256:... --model-cache DIR --out DIR

Writes DIR/story.md (the table), DIR/story.json, and DIR/story.tar (the evidence bundle,
the recipes, the transcript and the engines' logs). Exit 1 if any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import re
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.adapters.nvml import NvmlProbe
from anvil_ctl.adapters.shm import proc_cgroup_container
from anvil_ctl.config.host import load_host_config
from anvil_ctl.core.engine_profile import LLAMA_CPP_CUDA
from anvil_ctl.recipes.model import load_recipe, recipe_digest
from anvil_ctl.recipes.spec import container_spec
from scripts import engine_timing
from scripts.llama_host import (
    ALIAS,
    BINDING,
    LlamaHost,
    container_logs,
    open_llama_host,
    routed_curl,
    start_by_hand,
    wait_listed,
)

INCUMBENT, CANDIDATE = "llama-smollm2-cuda-2k", "llama-smollm2-cuda-8k"
TOLERANCE_MIB = 1
ROLE = "compute-a"


def redact(uuid: str) -> str:
    return "GPU-" + hashlib.sha256(uuid.lower().encode()).hexdigest()[:8]


def utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds")


def parse_at(at: str) -> float:
    return datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


# -- nvidia-smi beside the story ---------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # when nvidia-smi read it (its own timestamp field)
    uuid: str
    used: int
    free: int


class SmiSampler:
    """`nvidia-smi --query-gpu ... -lms 50` in the background; every line kept with its time."""

    def __init__(self, interval_ms: int = 50) -> None:
        self.samples: list[Sample] = []
        self._proc = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=timestamp,uuid,memory.used,memory.free",
                "--format=csv,noheader,nounits",
                f"--loop-ms={interval_ms}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            # nvidia-smi's own time of the reading: its output reaches a pipe in bursts, so
            # the time a line arrives can be later than the reading by a buffer's worth.
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                at = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append(Sample(at, parts[1].lower(), int(parts[2]), int(parts[3])))

    def stop(self) -> None:
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)

    def window(self, uuid: str, t0: float, t1: float) -> list[Sample]:
        return [s for s in self.samples if s.uuid == uuid.lower() and t0 <= s.t <= t1]


@dataclass
class Story:
    sampler: SmiSampler
    uuid: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    vram: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def check(self, ok: bool, what: str, **detail: Any) -> bool:
        self.checks.append({"ok": bool(ok), "what": what, **detail})
        print(f"  [{'ok' if ok else 'FAIL'}] {what} {json.dumps(detail) if detail else ''}", flush=True)
        return bool(ok)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[dict[str, Any]]:
        """One row of the table: its wall-clock start, seconds, and the card's used MiB after."""
        row: dict[str, Any] = {"step": name, "start": utc(time.time())}
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        try:
            yield row
            row.setdefault("ok", True)
        except Exception as exc:
            row["ok"] = False
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            raise
        finally:
            row["seconds"] = round(time.monotonic() - t0, 2)
            time.sleep(0.15)  # one more nvidia-smi line after the step
            last = [s for s in self.sampler.samples if s.uuid == self.uuid.lower()]
            row["smi_used_mib_after"] = last[-1].used if last else None
            self.steps.append(row)

    def compare(self, what: str, field_name: str, recorded: int, t0: float, t1: float) -> None:
        """A recorded VRAM figure against the nvidia-smi samples of the window it was read in."""
        window = self.sampler.window(self.uuid, t0 - 0.1, t1 + 0.1)
        if not window:
            self.check(False, f"VRAM {what}: no nvidia-smi sample in its window", recorded=recorded)
            return
        mid = (t0 + t1) / 2
        nearest = min(window, key=lambda s: abs(s.t - mid))
        values = sorted({getattr(s, field_name) for s in window})
        theirs = getattr(nearest, field_name)
        row = {
            "what": what,
            "field": f"{field_name}_mib",
            "recorded": recorded,
            "nvidia_smi": theirs,
            "diff": recorded - theirs,
            "smi_range_in_window": [values[0], values[-1]],
            "samples": len(window),
            "window_s": round(t1 - t0, 3),
            "at": utc(nearest.t),
        }
        row["ok"] = abs(recorded - theirs) <= TOLERANCE_MIB
        self.vram.append(row)
        self.check(row["ok"], f"VRAM {what} {field_name}", recorded=recorded, nvidia_smi=theirs)


# -- helpers -----------------------------------------------------------------------------------


def run(host: LlamaHost, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[str, float, float]:
    """anvilctl ARGS; its stdout and the wall-clock window it ran in."""
    t0 = time.time()
    r = host.anvilctl(*args, echo=True)
    t1 = time.time()
    if r.returncode not in ok:
        raise RuntimeError(f"`anvilctl {' '.join(args)}` exited {r.returncode}: {r.stderr[-400:]}")
    return str(r.stdout), t0, t1


def run_json(host: LlamaHost, *args: str) -> tuple[Any, float, float]:
    t0 = time.time()
    r = host.anvilctl("--json", *args)
    t1 = time.time()
    if r.returncode != 0:
        raise RuntimeError(f"`anvilctl --json {' '.join(args)}` exited {r.returncode}: {r.stderr[-400:]}")
    return json.loads(r.stdout), t0, t1


def gpus_reading(story: Story, host: LlamaHost, when: str) -> dict[str, Any]:
    """`anvilctl gpus` now: its used and free MiB against nvidia-smi, its owner and processes."""
    out, t0, t1 = run_json(host, "gpus")
    card = next(g for g in out["gpus"] if g["uuid"].lower() == story.uuid.lower())
    story.compare(f"anvilctl gpus, {when}", "used", card["used_mib"], t0, t1)
    story.compare(f"anvilctl gpus, {when}", "free", card["free_mib"], t0, t1)
    return dict(card)


def pids_by_container(uuid: str) -> dict[str, list[int]]:
    """nvidia-smi's compute processes on the card, by the container their cgroup names."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, list[int]] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].lower() == uuid.lower():
            found.setdefault(proc_cgroup_container(int(parts[1])) or "?", []).append(int(parts[1]))
    return found


def steps_of(host: LlamaHost, tx_id: str) -> list[dict[str, Any]]:
    out, _, _ = run_json(host, "audit", "show", tx_id)
    return list(out["steps"])


def step_window(steps: list[dict[str, Any]], name: str) -> tuple[float, float, dict[str, Any]]:
    """The first and last event times of a step and its result's detail."""
    mine = [e for e in steps if e["step"] == name]
    result = next(e for e in mine if e["event"] == "result")
    return parse_at(mine[0]["at"]), parse_at(result["at"]), dict(result["detail"])


def newest_tx(host: LlamaHost, kind: str) -> str:
    out, _, _ = run_json(host, "audit", "transactions", "--kind", kind)
    return str(out[0]["tx_id"])


def release_check(story: Story, host: LlamaHost, tx_id: str, label: str) -> None:
    """The release-vram step's readings against nvidia-smi, and how long the memory took:
    by the gate (its first poll follows the confirmed stop) and by nvidia-smi's samples."""
    steps = steps_of(host, tx_id)
    t0, t1, detail = step_window(steps, "release-vram")
    before = _by_uuid(detail["before"], story.uuid)
    after = _by_uuid(detail["after"], story.uuid)
    story.compare(f"{label}: release-vram, first poll", "free", before["free_mib"], t0, t0 + 0.2)
    if detail["polls"] > 1:  # with one poll, `after` is the `before` reading
        story.compare(f"{label}: release-vram, last poll", "free", after["free_mib"], t1 - 0.2, t1)
    stop_step = "stop-incumbent" if label == "load" else "stop-current"
    s0, stopped, _ = step_window(steps, stop_step)
    idle = story.facts["idle_used_mib"]
    window = story.sampler.window(story.uuid, s0, t1 + 1)
    held = max((s.used for s in window), default=idle)
    free_at = next((s.t for s in window if s.t >= s0 and s.used <= idle + TOLERANCE_MIB), None)
    story.facts[f"{label}_release"] = {
        "gate_waited_s": detail["waited_s"],
        "gate_polls": detail["polls"],
        "required_free_mib": detail["required_free_mib"],
        "gate_first_poll_used_mib": before["used_mib"],
        "smi_held_during_stop_mib": held - idle,
        "smi_idle_after_stop_confirmed_s": None if free_at is None else round(free_at - stopped, 3),
        "smi_idle_after_stop_began_s": None if free_at is None else round(free_at - s0, 3),
    }
    story.check(
        bool(detail["released"]),
        f"{label}: the release gate saw the memory free",
        **story.facts[f"{label}_release"],
    )


def _by_uuid(cards: dict[str, Any], uuid: str) -> dict[str, Any]:
    found = (
        cards.get(uuid)
        or cards.get(uuid.lower())
        or next(v for k, v in cards.items() if k.lower() == uuid.lower())
    )
    return dict(found)


# -- the recipes, from the CPU engine's --------------------------------------------------------


def render_recipe(context: int, image_id: str, need_mib: int, wheel_sha: str, measured: str) -> str:
    """The CPU recipe of the same context, made the CUDA engine's."""
    cpu = "llama-smollm2-2k" if context == 2048 else "llama-smollm2-8k"
    text = (REPO / "recipes" / f"{cpu}.toml").read_text()
    _head, _, body = text.partition('\nname = "')
    name = INCUMBENT if context == 2048 else CANDIDATE
    header = (
        f"# llama.cpp (llama-cpp-python 0.3.36 server, built with GGML_CUDA for sm_90) serving\n"
        f"# SmolLM2-135M-Instruct GGUF Q4_1 at {context} tokens on one GPU: the GPU lifecycle's "
        f"{'incumbent' if context == 2048 else 'candidate'}.\n"
        "# Image: scripts/build_llama_cuda.py on the GPU host (its ID depends on the CUDA wheel and\n"
        "# the host's CUDA runtime libraries copied into it); written by scripts/gpu_story.py.\n"
        f"# vram_need_mib: {measured}\n"
    )
    body = '\nname = "' + body
    subs = [
        (f'name = "{cpu}"', f'name = "{name}"'),
        ("llama-cpp-python 0.3.36 (CPU)", "llama-cpp-python 0.3.36 (CUDA, one GPU)"),
        ('engine = "llama-cpp-python"', 'engine = "llama-cpp-python-cuda"'),
        ("gpu_roles = []\n", f'gpu_roles = ["{ROLE}"]\n'),
        ("vram_need_mib = 0", f"vram_need_mib = {need_mib}"),
        ('profile = "real-small"', 'profile = "real-gpu"'),
        ('  "--n_threads_batch", "2",\n', '  "--n_threads_batch", "2",\n  "--n_gpu_layers", "-1",\n'),
    ]
    for old, new in subs:
        if old not in body:
            raise SystemExit(f"gpu_story: {cpu}.toml has no {old!r}")
        body = body.replace(old, new, 1)
    body = re.sub(r'\ngpu_roles_reason = "[^"]*"', "", body)
    body = re.sub(r'\nimage = "sha256:[0-9a-f]{64}"', f'\nimage = "{image_id}"', body, count=1)
    body = re.sub(
        r'\nengine = "llama-cpp-python==0\.3\.36 from its PyPI sdist, CMAKE_ARGS=[^"]*"',
        '\nengine = "llama-cpp-python==0.3.36 from its PyPI sdist (trimmed: '
        "scripts/build_llama_cuda.py trim), CMAKE_ARGS=-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 "
        '-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"',
        body,
    )
    body = re.sub(r'\nengine_wheel_sha256 = "[0-9a-f]{64}"', f'\nengine_wheel_sha256 = "{wheel_sha}"', body)
    body = body.replace(
        'dependency_wheels = "scripts/llama-server-wheels.sha256"',
        "dependency_wheels = \"the image's /opt/llama/MANIFEST.json "
        '(CPython 3.12 wheels of the same versions)"',
    )
    return header + body


# -- the story ---------------------------------------------------------------------------------


def measure_need(
    story: Story, runtime: DockerRuntime, config_path: Path, recipe: Path, context: int
) -> dict[str, Any]:
    """Start the engine alone, run a long prompt, read the card; stop it and time the release."""
    config = load_host_config(config_path)
    spec = container_spec(
        load_recipe(recipe),
        slot_name="primary",
        slot=config.slots["primary"],
        host_config=config,
        recipe_path=recipe,
        tx_id="measure",
    )
    spec = replace(spec, name=f"measure-{context}")
    probe = NvmlProbe()

    def card() -> Any:
        return next(g for g in probe.gpus() if g.uuid.lower() == story.uuid.lower())

    idle = card().used_mib
    cid = runtime.create(spec)
    t_start = time.monotonic()
    runtime.start(cid)
    loaded_s = wait_listed(f"http://{BINDING}", spec_model(recipe), timeout_s=180)
    import httpx

    words = int(context * 0.7)
    r = httpx.post(
        f"http://{BINDING}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hello " * words}], "max_tokens": 16},
        timeout=120,
    )
    r.raise_for_status()
    held = card()
    if held.used_mib - idle < 100:
        raise RuntimeError(
            f"the engine took {held.used_mib - idle} MiB of the card: it is not on the GPU (see its log)"
        )
    procs = {p.pid: p.used_mib for p in held.processes}
    owners = {pid: proc_cgroup_container(pid) for pid in procs}
    info = runtime.inspect(cid)
    t_stop = time.monotonic()
    runtime.stop(cid, 10)
    t_exited = time.monotonic()
    polls = 0
    while True:
        polls += 1
        now = card()
        if now.used_mib <= idle + TOLERANCE_MIB:
            break
        if time.monotonic() - t_exited > 30:
            raise RuntimeError(f"VRAM not back to idle 30 s after the stop: {now.used_mib} MiB used")
        time.sleep(0.005)
    t_free = time.monotonic()
    runtime.remove(cid)
    used = held.used_mib - idle
    out = {
        "context": context,
        "idle_used_mib": idle,
        "used_mib_serving": held.used_mib,
        "held_mib": used,
        "processes": {str(p): m for p, m in procs.items()},
        "process_containers": {str(p): (c or "")[:12] for p, c in owners.items()},
        "container_init_pid": info.pid,
        "load_s": round(loaded_s, 2),
        "stop_s": round(t_exited - t_stop, 3),
        "release_after_exit_s": round(t_free - t_exited, 3),
        "release_polls": polls,
        "prompt_tokens": r.json().get("usage", {}).get("prompt_tokens"),
        "started_to_freed_s": round(t_free - t_start, 2),
    }
    story.check(
        all(c == cid for c in owners.values()) and bool(owners),
        f"{context}: NVML's PIDs map to the container by cgroup",
        owners={str(p): (c or "")[:12] for p, c in owners.items()},
        init_pid=info.pid,
    )
    story.check(
        sum(procs.values()) <= used + TOLERANCE_MIB,
        f"{context}: the processes hold no more than the card's growth",
        processes=sum(procs.values()),
        grew=used,
    )
    return out


def spec_model(recipe: Path) -> str:
    return str(load_recipe(recipe).served_model)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image-id", required=True, help="the CUDA engine image, loaded in $DOCKER_HOST")
    parser.add_argument(
        "--wheel-sha256", default="", help="the CUDA wheel's SHA-256 (the recipes' provenance)"
    )
    parser.add_argument("--model-cache", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=REPO / "state" / "gpu-story")
    parser.add_argument("--margin-mib", type=int, default=256, help="reserve = idle free - need(8k) - margin")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work: Path = args.work
    with contextlib.suppress(FileNotFoundError):
        subprocess.run(["rm", "-rf", str(work)], check=True)
    (work / "recipes").mkdir(parents=True)
    sampler = SmiSampler()
    story = Story(sampler)
    host: LlamaHost | None = None
    runtime = DockerRuntime(gpu_mode="auto")
    started = time.time()
    try:
        host = tell(story, args, work, runtime)
    except Exception as exc:  # the table and the bundle come home either way
        story.check(False, f"the story stopped: {type(exc).__name__}: {exc}")
    finally:
        story.facts["total_s"] = round(time.time() - started, 1)
        finish(story, args, work, host, runtime)
        sampler.stop()
    failed = [c for c in story.checks if not c["ok"]]
    print(f"\n{len(story.checks)} checks, {len(failed)} failed")
    return 1 if failed else 0


def tell(story: Story, args: argparse.Namespace, work: Path, runtime: DockerRuntime) -> LlamaHost:
    with story.step("HAProxy and GPU roles from NVML") as row:
        host = open_llama_host(
            work,
            args.model_cache,
            health_path=LLAMA_CPP_CUDA.check_path,
            recipes_dir=work / "recipes",
            gpu="nvml",
        )
        detected, _, _ = run_json(host, "gpus", "detect")
        role = detected["roles"][ROLE]
        story.uuid = role["uuid"]
        story.facts["gpu"] = {
            "name": role["name"],
            "uuid": redact(role["uuid"]),
            "capacity_mib": role["capacity_mib"],
        }
        story.facts["driver"] = NvmlProbe().driver_version()
        story.facts["docker_gpu_mode"] = runtime.resolved_gpu_mode()
        row["detail"] = (
            f"{role['name']} {redact(role['uuid'])}, {role['capacity_mib']} MiB; "
            f"Docker GPU mode {story.facts['docker_gpu_mode']}"
        )
        time.sleep(0.3)
        idle = gpus_reading(story, host, "idle")
        story.facts["idle_used_mib"] = idle["used_mib"]

        def write_config(reserve: int | None) -> None:
            roles = detected["toml"]
            if reserve is not None:
                roles = roles.replace(
                    f'uuid = "{role["uuid"]}"', f'uuid = "{role["uuid"]}"\nreserve_mib = {reserve}'
                )
            host.write_config(
                host.config,
                host="anvil-gpu",
                roles=roles + "\n",
                slot_extra=f'gpu_roles = ["{ROLE}"]\n',
                policy_extra="vram_release_deadline_s = 60\n",
            )

        write_config(None)

    needs: dict[int, dict[str, Any]] = {}
    for context in (2048, 8192):
        with story.step(f"measure the VRAM need at {context} tokens") as row:
            (work / "probe").mkdir(exist_ok=True)
            probe_recipe = work / "probe" / f"{INCUMBENT if context == 2048 else CANDIDATE}.toml"
            probe_recipe.write_text(render_recipe(context, args.image_id, 0, args.wheel_sha256, "probe"))
            m = measure_need(story, runtime, host.config, probe_recipe, context)
            m["need_mib"] = 64 * math.ceil(m["held_mib"] / 64)
            needs[context] = m
            probe_recipe.unlink()
            row["detail"] = (
                f"card +{m['held_mib']} MiB (process {sum(m['processes'].values())} MiB), "
                f"need {m['need_mib']}; "
                f"loaded in {m['load_s']} s; back to idle {m['release_after_exit_s']} s after the exit "
                f"({m['release_polls']} polls)"
            )
    story.facts["measured"] = needs
    for context, name in ((2048, INCUMBENT), (8192, CANDIDATE)):
        m = needs[context]
        measured = (
            f"measured by scripts/gpu_story.py on an NVIDIA H200 (driver {story.facts['driver']}): "
            f"the card's used MiB grew {m['held_mib']} with the engine loaded and a "
            f"{m['prompt_tokens']}-token prompt run, rounded up to 64 MiB"
        )
        (work / "recipes" / f"{name}.toml").write_text(
            render_recipe(context, args.image_id, m["need_mib"], args.wheel_sha256, measured)
        )
    reserve = idle["free_mib"] - needs[8192]["need_mib"] - args.margin_mib
    story.facts["reserve_mib"] = reserve
    write_config(reserve)

    with story.step("init; the incumbent started by hand (2,048 tokens) and routed") as row:
        run(host, "init")
        inc = start_incumbent(host, runtime)
        status, body = routed_curl(host, "Say hello.")
        story.check(status == 200, "curl through HAProxy reaches the hand-started incumbent", status=status)
        owners = pids_by_container(story.uuid)
        story.check(
            list(owners) == [inc],
            "nvidia-smi's processes on the card are the incumbent's",
            owners={k[:12]: v for k, v in owners.items()},
        )
        row["detail"] = (
            f"container {inc[:12]}, init PID {runtime.inspect(inc).pid}, GPU PIDs {owners.get(inc)}"
        )
        story.facts["incumbent"] = inc

    with story.step("adopt it (8,192 refused by the engine's 400, 2,048 accepted)") as row:
        adopt = ("adopt", inc, "--slot", "primary", "--engine", "llama-cpp-python-cuda", "--context-tokens")
        run(host, *adopt, "8192", ok=(2,))
        run(host, *adopt, "2048")
        card = gpus_reading(story, host, "after adopt")
        story.check(
            (card["owner"] or {}).get("container_id") == inc, "the ledger: compute-a owned by the incumbent"
        )
        row["detail"] = (
            f"owner {(card['owner'] or {}).get('container_id', '')[:12]}; used {card['used_mib']} MiB"
        )

    with story.step("load the 8,192-token candidate (incumbent stopped, its VRAM release awaited)") as row:
        run(host, "load", CANDIDATE, "--slot", "primary")
        load_tx = newest_tx(host, "load")
        cand = str(step_window(steps_of(host, load_tx), "start-candidate")[2]["container_id"])
        release_check(story, host, load_tx, "load")
        card = gpus_reading(story, host, "after load")
        story.check(
            (card["owner"] or {}).get("container_id") == cand, "the ledger: compute-a owned by the candidate"
        )
        story.check(
            list(pids_by_container(story.uuid)) == [cand], "nvidia-smi's processes are the candidate's"
        )
        story.check(runtime.inspect(inc).status == "exited", "the incumbent is stopped, not removed")
        rel = story.facts["load_release"]
        row["detail"] = (
            f"candidate {cand[:12]}; release gate waited {rel['gate_waited_s']} s "
            f"({rel['gate_polls']} polls), "
            f"nvidia-smi idle {rel['smi_idle_after_stop_began_s']} s after the stop began"
        )
        story.facts["candidate"] = cand

    with story.step("qualify with real-gpu") as row:
        out, _q0, _q1 = run_json(host, "qualify", "--slot", "primary", "--profile", "real-gpu")
        story.facts["qualify"] = {
            "tx_id": out["tx_id"],
            "outcome": out["outcome"],
            "gates": {g["name"]: g["passed"] for g in out["gates"]},
        }
        tx_dir = Path(out["tx_dir"])
        before_file = tx_dir / "vram-before.json"
        before = json.loads(before_file.read_text()) if before_file.exists() else {}
        story.check(bool(before.get("cards")), "qualify read the cards before the workload")
        for c in before.get("cards", []):
            if c["uuid"].lower() == story.uuid.lower():
                t = (tx_dir / "vram-before.json").stat().st_mtime
                story.compare("qualify: vram-before.json", "free", c["free_mib"], t - 0.5, t)
        reserve_file = next(tx_dir.glob("*-vram_reserve.json"))
        t = reserve_file.stat().st_mtime
        for c in json.loads(reserve_file.read_text())["evidence"]["cards"]:
            story.compare(
                "qualify: vram_reserve gate (after the workload)", "free", c["free_mib"], t - 0.5, t
            )
        gates = {g["name"]: g for g in out["gates"]}
        story.check(gates["vram_reserve"]["passed"], "the VRAM reserve holds after the workload")
        story.check(gates["capacity"]["passed"], "capacity passes on GPU tokens")
        story.check(gates["log_audit"]["passed"], "the log audit finds no CUDA error, OOM or traceback")
        cross_check(story, tx_dir, cand)
        failed = sorted(n for n, g in gates.items() if not g["passed"])
        story.facts["qualify"]["failed"] = failed
        row["detail"] = f"{out['outcome']}; failed: {', '.join(failed) or 'none'}"

    with story.step(
        "waive what a 135M model fails; promote (official client); curl and openai via HAProxy"
    ) as row:
        digest = recipe_digest(load_recipe(work / "recipes" / f"{CANDIDATE}.toml"))
        expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).date().isoformat()
        if story.facts["qualify"]["failed"]:
            run(
                host,
                "waive",
                "--policy",
                "gate",
                "--scope",
                digest,
                "--gates",
                ",".join(story.facts["qualify"]["failed"]),
                "--approved-by",
                "operator",
                "--reason",
                "135M model: instruction following is not required of it here",
                "--expires",
                expires,
            )
        run(host, "promote", "--slot", "primary", "--approved-by", "operator")
        promote_tx = newest_tx(host, "promote")
        a0, a1, acc = step_window(steps_of(host, promote_tx), "vram-after-acceptance")
        for c in acc.get("cards", []):
            story.compare("promote: vram-after-acceptance", "free", c["free_mib"], a0, a1)
        story.check(bool(acc.get("passed")), "the VRAM reserve holds after real-client acceptance")
        status, body = routed_curl(host, "Say hello.")
        story.check(
            status == 200, "curl through HAProxy after promote", status=status, model=body.get("model")
        )
        import openai

        client = openai.OpenAI(
            base_url=host.haproxy.url + "/v1", api_key=host.client_token, max_retries=0, timeout=120
        )
        try:
            reply = client.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16
            )
        finally:
            client.close()
        story.check(
            bool(reply.choices), "the openai client through HAProxy", content=reply.choices[0].message.content
        )
        gpus_reading(story, host, "after promote")
        row["detail"] = f"openai client: {reply.choices[0].message.content!r}"

    with story.step("rollback to the same incumbent container") as row:
        run(host, "rollback", "--slot", "primary")
        rb_tx = newest_tx(host, "rollback")
        release_check(story, host, rb_tx, "rollback")
        info = runtime.inspect(inc)
        story.check(info.status == "running", "the incumbent container runs again", container=inc[:12])
        card = gpus_reading(story, host, "after rollback")
        story.check(
            (card["owner"] or {}).get("container_id") == inc,
            "the ledger: compute-a owned by the incumbent again",
        )
        story.check(
            list(pids_by_container(story.uuid)) == [inc],
            "nvidia-smi's processes are the incumbent's (the same container ID)",
        )
        rel = story.facts["rollback_release"]
        row["detail"] = (
            f"incumbent {inc[:12]} running; release gate waited {rel['gate_waited_s']} s; "
            f"nvidia-smi idle {rel['smi_idle_after_stop_began_s']} s after the stop began"
        )

    with story.step("recheck, audit verify, evidence export and verify") as row:
        run(host, "recheck", "--slot", "primary")
        run(host, "audit", "verify")
        export = work / "bundle"
        out_text, _, _ = run(host, "evidence", "export", story.facts["qualify"]["tx_id"], str(export))
        found = re.search(r"manifest sha256 ([0-9a-f]{64})", out_text)
        story.facts["manifest_sha256"] = found.group(1) if found else None
        run(host, "evidence", "verify", str(export))
        row["detail"] = f"manifest {story.facts['manifest_sha256']}"
    return host


def start_incumbent(host: LlamaHost, runtime: DockerRuntime) -> str:
    """The 2,048-token CUDA serve started by hand, routed as llm.primary (what an operator had)."""
    recipe = host.work / "recipes" / f"{INCUMBENT}.toml"
    name, served = "llama-cuda-2k-by-hand", spec_model(recipe)
    return start_by_hand(host, recipe, name=name, served_model=served, runtime=runtime, timeout_s=180)


def cross_check(story: Story, tx_dir: Path, candidate: str) -> None:
    """The capacity gate's figures against llama.cpp's own llama_perf_context_print lines."""
    capacity = next(tx_dir.glob("*-capacity.json"))
    cells = [c for c in json.loads(capacity.read_text())["evidence"]["cells"] if not c.get("skipped")]
    assert LLAMA_CPP_CUDA.timing is not None
    blocks = engine_timing.parse_blocks(container_logs(candidate, timestamps=True), LLAMA_CPP_CUDA.timing)
    report = engine_timing.compare(cells, blocks)
    rows = engine_timing.report_cells(report)
    story.facts["capacity_cross_check"] = {"decode_tolerance": report["decode_tolerance"], "cells": rows}
    for c in rows:
        story.check(
            bool(c["decode_within_engine"]),
            f"capacity {c['nominal_tokens']}: decode inside llama.cpp's own window",
            gate=round(float(str(c["gate_decode_tps_p50"])), 1),
            engine_eval=round(float(str(c["engine_eval_tps_p50"])), 1),
        )


def finish(
    story: Story, args: argparse.Namespace, work: Path, host: LlamaHost | None, runtime: DockerRuntime
) -> None:
    out: Path = args.out
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if host is not None:
        (logs / "transcript.txt").write_text("".join(host.log))
        host.stop()
    for info in runtime.list():
        with contextlib.suppress(Exception):
            (logs / f"{info.name}.log").write_text(container_logs(info.id, timestamps=True))
    for info in runtime.list(labels={"io.anvil.managed": "true"}):
        with contextlib.suppress(Exception):
            runtime.remove(info.id, force=True)
    for info in runtime.list():
        with contextlib.suppress(Exception):
            runtime.remove(info.id, force=True)
    story.facts["samples"] = len(story.sampler.samples)
    data = {"steps": story.steps, "vram": story.vram, "checks": story.checks, "facts": story.facts}
    text = (
        json.dumps(data, indent=2, default=str).replace(story.uuid, redact(story.uuid))
        if story.uuid
        else json.dumps(data, indent=2, default=str)
    )
    (out / "story.json").write_text(text + "\n")
    (out / "story.md").write_text(table(story))
    with tarfile.open(out / "story.tar", "w") as tar:
        for name in ("bundle", "recipes", "logs"):
            if (work / name).exists():
                tar.add(work / name, arcname=name)
        tar.add(out / "story.json", arcname="story.json")


def table(story: Story) -> str:
    lines = [
        "| step | start (UTC) | s | nvidia-smi used after (MiB) | what happened |",
        "|---|---|---|---|---|",
    ]
    for r in story.steps:
        detail = r.get("detail") or r.get("error") or ""
        lines.append(
            f"| {r['step']} | {r['start'][11:23]} | {r['seconds']} | "
            f"{r.get('smi_used_mib_after')} | {detail} |"
        )
    lines += [
        "",
        "| VRAM figure in the record | field | recorded | nvidia-smi | diff | samples in window | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in story.vram:
        lines.append(
            f"| {v['what']} | {v['field']} | {v['recorded']} | {v['nvidia_smi']} | {v['diff']} "
            f"| {v['samples']} | {'yes' if v['ok'] else 'NO'} |"
        )
    failed = [c for c in story.checks if not c["ok"]]
    lines += ["", f"{len(story.checks)} checks, {len(failed)} failed"] + [
        f"- FAILED: {c['what']}" for c in failed
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
