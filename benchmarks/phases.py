"""Where load, promote and rollback spend their wall time, per step and per kind of wait.

Run inside the hermetic environment (the same campaign host as benchmarks/paired.py):

    scripts/testenv run -- .venv/bin/python benchmarks/paired.py  # the ratios
    scripts/testenv run -- .venv/bin/python benchmarks/phases.py [--reps 2] [--json OUT]

Each `anvilctl` runs under this file's `--inner` mode (as benchmarks/owntime.py does), which
notes, with wall-clock times: every `time.sleep` (and its caller), every Docker SDK and httpx
request, every state-database transaction (`Store.write`, `Store.read`), and every log line
(debug level, so each step's intent and done). The parent prints, per command, how long each
step took and what it waited on inside it; "start-up" is the process start to the inner
mode's first instruction after its imports (the imports of the package are in it), and
"exit" is the last log line to the process's end. Benchmarks only; nothing here is shipped.
The breakdown measured with it, before and after the step work of issue 13: benchmarks/PHASES.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

KINDS = ("sleep", "docker", "http", "db-write", "db-read")


# -- inside the anvilctl process --------------------------------------------------------------


def inner(out: str, argv: list[str]) -> None:
    import httpx
    import requests

    from anvil_ctl.persistence.store import Store

    events: list[tuple[str, float, float, str]] = []  # kind, start (epoch s), seconds, label
    begun = time.time()

    def note(kind: str, label: str, started: float) -> None:
        events.append((kind, started, time.time() - started, label))

    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        f = sys._getframe(1)
        started = time.time()
        try:
            real_sleep(seconds)
        finally:
            note("sleep", f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}", started)

    time.sleep = sleep

    def timed_send(kind: str, send: Any) -> Any:
        def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return send(self, request, *args, **kwargs)
            finally:
                url = str(request.url)
                path = url.split("/", 3)[-1].split("?", maxsplit=1)[0] if "://" in url else url
                note(kind, f"{request.method} /{path[:40]}", started)

        return wrapper

    requests.Session.send = timed_send("docker", requests.Session.send)  # type: ignore[method-assign]
    httpx.Client.send = timed_send("http", httpx.Client.send)  # type: ignore[method-assign]

    def timed_cm(kind: str, cm: Any) -> Any:
        @contextlib.contextmanager
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            nested = getattr(self._batch, "session", None) is not None
            started = time.time()
            try:
                with cm(self, *args, **kwargs) as got:
                    yield got
            finally:
                if not nested:
                    f = sys._getframe(2)
                    note(kind, f.f_code.co_name, started)

        return wrapper

    Store.write = timed_cm("db-write", Store.write)  # type: ignore[method-assign]
    Store.read = timed_cm("db-read", Store.read)  # type: ignore[method-assign]

    import importlib

    for spec in os.environ.get("ANVIL_PHASES_FUNCS", "").split():
        module, _, qual = spec.partition(":")
        owner: Any = importlib.import_module(module)
        *path, name = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def timed_fn(*args: Any, _fn: Any = fn, _label: str = qual, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return _fn(*args, **kwargs)
            finally:
                note("fn", _label, started)

        setattr(owner, name, timed_fn)

    real_exit = os._exit
    profile_to = os.environ.get("ANVIL_PHASES_PROFILE")
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()

    def exit_noting(code: int) -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_to)
        with open(out, "w") as fh:
            json.dump({"begun": begun, "ended": time.time(), "events": events}, fh)
        real_exit(code)

    os._exit = exit_noting  # type: ignore[assignment]
    sys.argv = ["anvilctl", *argv]
    if profiler is not None:
        profiler.enable()
    from anvil_ctl.cli import console

    console()


# -- the parent -------------------------------------------------------------------------------


def traced(camp: Any, *args: str, profile: Path | None = None) -> dict[str, Any]:
    """Run `anvilctl ARGS` under the inner mode; its phases (and its cProfile in `profile`)."""
    env = camp.env | {"ANVIL_LOG_LEVEL": "debug", "ANVIL_LOG_FORMAT": "json"}
    funcs = os.environ.get("ANVIL_PHASES_FUNCS")
    if funcs:
        env["ANVIL_PHASES_FUNCS"] = funcs
    if profile is not None:
        env["ANVIL_PHASES_PROFILE"] = str(profile)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        started = time.time()
        r = subprocess.run(
            [sys.executable, __file__, "--inner", out.name, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        ended = time.time()
        if r.returncode != 0:
            raise SystemExit(f"anvilctl {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
        got = json.loads(Path(out.name).read_text())
    logs = []
    for line in r.stderr.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            from datetime import datetime

            at = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
            logs.append((at, rec.get("event", ""), rec.get("step", "")))
    return phases(started, ended, got, logs)


def phases(
    started: float, ended: float, got: dict[str, Any], logs: list[tuple[float, str, str]]
) -> dict[str, Any]:
    """Cut the run into intervals at its log lines; sum each kind of wait inside each."""
    marks: list[tuple[float, str]] = [(started, "start-up"), (got["begun"], "until the first step")]
    for at, event, step in logs:
        if event == "step intent":
            marks.append((at, step))
        elif event == "step done":
            marks.append((at, f"after {step}"))
        elif event in ("snapshot observed", "running", "committed"):
            marks.append((at, f"after '{event}'"))
    last_log = max((at for at, _e, _s in logs), default=got["ended"])
    marks.append((last_log, "exit"))
    marks.sort()
    rows: list[dict[str, Any]] = []
    for i, (at, name) in enumerate(marks):
        until = marks[i + 1][0] if i + 1 < len(marks) else ended
        inside = [e for e in got["events"] if at <= e[1] < until]
        kinds: dict[str, float] = collections.defaultdict(float)
        counts: dict[str, int] = collections.defaultdict(int)
        labels: dict[str, float] = collections.defaultdict(float)
        fns: list[str] = []
        for kind, _s, seconds, label in inside:
            kinds[kind] += seconds
            counts[kind] += 1
            if kind == "fn":
                fns.append(f"{label} {seconds:.3f}")
            else:
                labels[f"{kind} {label}"] += seconds
        rows.append(
            {
                "phase": name,
                "s": until - at,
                "kinds": dict(kinds),
                "counts": dict(counts),
                "top": sorted(labels.items(), key=lambda kv: -kv[1])[:4],
                "fns": fns,
                # in order, from the phase's start: (s, kind, seconds, label), for --json readers
                "events": [(round(s - at, 4), k, round(sec, 4), lb) for k, s, sec, lb in inside],
            }
        )
    return {"wall_s": ended - started, "rows": rows}


def report(name: str, runs: list[dict[str, Any]]) -> str:
    walls = " / ".join(f"{r['wall_s']:.2f}" for r in runs)
    lines = [f"### {name}: wall {walls} s", ""]
    lines.append("| phase | s (median) | " + " | ".join(KINDS) + " | top waits (last run) |")
    lines.append("|---|---|" + "---|" * len(KINDS) + "---|")
    names = [row["phase"] for row in runs[-1]["rows"]]
    for i, phase in enumerate(names):
        same = [r["rows"][i] for r in runs if i < len(r["rows"]) and r["rows"][i]["phase"] == phase]
        med = statistics.median(row["s"] for row in same)
        cells = []
        for kind in KINDS:
            vals = [row["kinds"].get(kind, 0.0) for row in same]
            n = same[-1]["counts"].get(kind, 0)
            cells.append(f"{statistics.median(vals):.3f} ({n})" if n else "")
        top = "; ".join(f"{label} {s:.3f}" for label, s in same[-1]["top"])
        lines.append(f"| {phase} | {med:.3f} | " + " | ".join(cells) + f" | {top} |")
    fns = [(row["phase"], row["fns"]) for row in runs[-1]["rows"] if row.get("fns")]
    if fns:
        lines += ["", "Timed functions (ANVIL_PHASES_FUNCS, last run, in order; nested ones overlap):", ""]
        lines += [f"- {phase}: " + ", ".join(calls) for phase, calls in fns]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--inner":
        inner(sys.argv[2], sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2, help="traced cycles after one untimed warm-up")
    parser.add_argument("--json", type=Path, help="also write the phases here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="one more cycle under cProfile: DIR/load.prof, promote.prof, rollback.prof",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "anvil-bench-phases")
    args = parser.parse_args()
    if not os.environ.get("ANVIL_TESTENV"):
        print(
            "run inside the hermetic environment: "
            "scripts/testenv run -- .venv/bin/python benchmarks/phases.py"
        )
        return 2
    import compileall

    from benchmarks.paired import RECIPE, SLOT, anvil_cycle, anvilctl, verified
    from scripts.campaign import reserve_waiver, start_campaign, start_incumbent_by_hand
    from scripts.routers import exit_on_sigterm

    exit_on_sigterm()
    compileall.compile_dir(REPO / "anvil_ctl", quiet=1)
    camp = start_campaign(args.work)
    runs: dict[str, list[dict[str, Any]]] = {"load": [], "promote": [], "rollback": []}
    try:
        anvilctl(camp, "init")
        incumbent = start_incumbent_by_hand(camp)
        anvilctl(camp, "adopt", incumbent, "--slot", SLOT, "--context-tokens", "524288")
        anvilctl(camp, *reserve_waiver("bench"))
        anvil_cycle(camp)  # warm-up
        for _ in range(args.reps):
            runs["load"].append(traced(camp, "load", RECIPE, "--slot", SLOT))
            verified(camp)
            runs["promote"].append(traced(camp, "promote", "--slot", SLOT, "--approved-by", "bench"))
            runs["rollback"].append(traced(camp, "rollback", "--slot", SLOT))
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            traced(camp, "load", RECIPE, "--slot", SLOT, profile=args.profile / "load.prof")
            verified(camp)
            traced(
                camp,
                "promote",
                "--slot",
                SLOT,
                "--approved-by",
                "bench",
                profile=args.profile / "promote.prof",
            )
            traced(camp, "rollback", "--slot", SLOT, profile=args.profile / "rollback.prof")
    finally:
        camp.stop()
    for name, got in runs.items():
        print(report(name, got))
        print()
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
