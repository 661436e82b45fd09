"""The client's view of a transaction: what a client of the router sees while the slot's serve changes.

Run inside the hermetic environment (real dockerd, real routers, stub engines in containers):

    scripts/testenv run -- .venv/bin/python benchmarks/window.py [--reps 3] [--routers smg,haproxy]
        [--markdown-out F]

Per router, one campaign host (scripts/chaos.py: simulated GPUs, the stub incumbent routed
and adopted; on HAProxy adopted without a gauge, so its drain is counted by HAProxy's
`scur`). Transactions that change what the router serves, through the router with the
official `openai` client (no retries):

- `load --promote`: incumbent -> a candidate whose identity was qualified before, promoted
  in the load's own process; `load, promote`: the same as two commands (the promotion's
  process start-up falls inside the window); `rollback`: candidate -> incumbent.
- steady: short requests one after another. Counted: answers cut (a request that broke
  off), failed requests by status, and the window: the longest time between two successful
  answers. Its floor is what no controller can avoid on one GPU: the old serve's stop
  plus the next serve's start and readiness, read from the same transaction's journal
  (stop step minus its drain wait, start, health). The steps inside the window are kept
  as a timeline (seconds from the last success before it).
- streams: two streams in flight when the transaction starts (through the router; for
  `unload`, to the loaded candidate directly). Counted: answers cut (no finish_reason), and
  how long the drain waited against the longest stream's remaining time when it began.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from scripts.chaos import ALIAS, BINDING, ChaosHost

TOKENS_PER_S = 1000  # the stub recipes' decode rate
STREAM_S = 30.0
CANDIDATE_MODEL = "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp"
STEADY = ("load --promote", "load, promote", "rollback")
STREAMS = ("load --promote", "rollback", "unload")
INCUMBENT_ENGINE = {"smg": "stub", "haproxy": "openai-compatible"}


@dataclass
class Ask:
    started: float  # wall clock (time.time), to set against the journal's timestamps
    ended: float
    status: int | str  # HTTP status, or "cut" (the connection broke off)


@dataclass
class Client:
    """Short requests one after another until stopped."""

    host: ChaosHost
    asks: list[Ask] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = openai.OpenAI(
            base_url=self.host.camp.router.url + "/v1",
            api_key=self.host.camp.client_token,
            max_retries=0,
            timeout=30,
        )
        try:
            while not self.stop.is_set():
                t0 = time.time()
                status: int | str
                try:
                    client.chat.completions.create(
                        model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                    status = 200
                except openai.APIStatusError as exc:
                    status = exc.status_code
                except openai.APIConnectionError:
                    status = "cut"
                self.asks.append(Ask(t0, time.time(), status))
                if status != 200:
                    time.sleep(0.05)
        finally:
            client.close()


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def floor_s(shown: dict[str, Any]) -> float:
    """The old serve's stop (without its drain wait), the next one's start and readiness."""
    span: dict[str, float] = {}
    drained = 0.0
    for step in shown["steps"]:
        if step["phase"] != "do":
            continue
        if step["event"] == "intent":
            span[step["step"]] = -_at(step["at"])
        elif step["event"] == "result" and step["step"] in span:
            span[step["step"]] += _at(step["at"])
            drain = (step.get("detail") or {}).get("drain")
            if isinstance(drain, dict):
                drained += float(drain.get("waited_s") or 0.0)
    parts = ("stop-incumbent", "stop-current", "start-candidate", "await-candidate", "start-target")
    return sum(span.get(p, 0.0) for p in parts) - drained


def ensure_qualified(host: ChaosHost) -> None:
    """The candidate recipe's identity has a standing verified decision (what `load --promote`
    needs): loaded once and verified, as a `qualify` that passed would record."""
    host.prepare("promote")  # a loaded candidate, verified by prepare


def to_promoted(host: ChaosHost) -> str:
    """Bring the host to the promoted candidate (C), where a rollback brings back the incumbent."""
    phase = host.prepare("rollback")
    if phase == "A":
        swap(host, "load --promote")
        phase = host.prepare("rollback")
    assert phase == "C", f"rollback is measured from the promoted candidate, not {phase}"
    return phase


def before(host: ChaosHost, name: str) -> None:
    if name == "rollback":
        to_promoted(host)
    else:
        host.prepare("load")
        host.unload_stopped_candidates()


def swap(host: ChaosHost, name: str) -> list[tuple[dict[str, Any], float, float]]:
    """Run the command(s) of `name` from the phase it starts in: each one's JSON outcome and
    its process's start and end (wall clock)."""
    runs = []

    def run(*argv: str) -> None:
        t0 = time.time()
        out = host.run(*argv)
        runs.append((out, t0, time.time()))

    if name == "load --promote":
        run(*host.argv("load"), "--promote", "bench")
    elif name == "load, promote":
        run(*host.argv("load"))  # its identity's decision stands (`ensure_qualified`)
        run(*host.argv("promote"))
    else:
        run(*host.argv("rollback", to_promoted(host)))
    return runs


def transactions(runs: list[tuple[dict[str, Any], float, float]]) -> list[dict[str, Any]]:
    """Each transaction the runs made, chained ones (`then`) included."""
    found = []
    for out, _, _ in runs:
        tx = out
        while tx:
            found.append(tx)
            tx = tx.get("then") or {}
    return found


def timeline(
    host: ChaosHost, runs: list[tuple[dict[str, Any], float, float]], start: float, end: float
) -> list[tuple[float, str]]:
    """(seconds from `start`, what) for each process start and end and each journaled state
    and step of the runs' transactions between `start` - 0.5 s and `end` + 0.5 s."""
    marks = [(start, "last success before the window"), (end, "next success")]
    for out, t0, t1 in runs:
        kind = out.get("kind", "?")
        marks += [(t0, f"{kind}: process started"), (t1, f"{kind}: process ended")]
    for tx in transactions(runs):
        shown = host.run("audit", "show", tx["tx_id"])
        for s in shown["states"]:
            marks.append((_at(s["at"]), f"{tx['kind']}: state {s['state']}"))
        for s in shown["steps"]:
            if s["phase"] == "do":
                marks.append((_at(s["at"]), f"{tx['kind']}: {s['step']} {s['event']}"))
    return sorted((t - start, what) for t, what in marks if start - 0.5 <= t <= end + 0.5)


def steady(host: ChaosHost, name: str) -> dict[str, Any]:
    client = Client(host)
    asker = threading.Thread(target=client.run, daemon=True)
    before(host, name)
    asker.start()
    time.sleep(1.0)
    runs = swap(host, name)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (client.asks and client.asks[-1].status == 200):
        time.sleep(0.05)
    time.sleep(0.5)
    client.stop.set()
    asker.join(60)
    txs = transactions(runs)
    assert all(t.get("state") == "committed" for t in txs), [(t.get("kind"), t.get("reason")) for t in txs]
    ok = [a.ended for a in client.asks if a.status == 200]
    start, end = max(itertools.pairwise(ok), key=lambda p: p[1] - p[0])
    failed: dict[str, int] = {}
    for a in client.asks:
        if a.status not in (200, "cut"):
            failed[str(a.status)] = failed.get(str(a.status), 0) + 1
    floor = floor_s(host.run("audit", "show", str(txs[0]["tx_id"])))
    return {
        "requests": len(client.asks),
        "cut": sum(1 for a in client.asks if a.status == "cut"),
        "failed": failed,
        "window_s": end - start,
        "floor_s": floor,
        "timeline": timeline(host, runs, start, end),
    }


def streams(host: ChaosHost, name: str) -> dict[str, Any]:
    if name == "unload":
        host.prepare("promote")  # a loaded candidate, reached at its binding
        url, token, model = BINDING, "unused", CANDIDATE_MODEL
    else:
        before(host, name)
        url, token, model = host.camp.router.url, host.camp.client_token, ALIAS
    ends: list[str | None] = []
    started = threading.Barrier(3)

    def one() -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=120)
        finish: str | None = None
        try:
            chunks = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "write at length"}],
                max_tokens=int(STREAM_S * TOKENS_PER_S),
                stream=True,
            )
            first = True
            for chunk in chunks:
                if first:
                    started.wait(30)
                    first = False
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        except openai.APIError:
            pass
        finally:
            client.close()
        ends.append(finish)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(30)
    first_chunk = time.time()
    if name == "unload":
        cand = host.candidate
        assert cand is not None
        runs = [(host.run("unload", cand, "--yes"), 0.0, 0.0)]
    else:
        runs = swap(host, name)
    for t in threads:
        t.join(180)
    if name == "unload":
        host.run("rollback", "--slot", "primary")  # the incumbent serves again for what follows
    first = transactions(runs)[0]
    shown = host.run("audit", "show", first["tx_id"])
    drains = [
        (s["at"], s["detail"]["drain"])
        for s in shown["steps"]
        if s["event"] == "result" and isinstance((s.get("detail") or {}).get("drain"), dict)
    ]
    at, drain = drains[0]
    began = _at(at) - float(drain["waited_s"])
    # By the stub's schedule (1,000 tok/s from the first chunk): the client reads the chunks
    # it was sent later than they were sent on a loaded machine.
    remaining = first_chunk + STREAM_S - began
    return {
        "cut": sum(1 for f in ends if f is None),
        "drain_waited_s": float(drain["waited_s"]),
        "remaining_s": remaining,
        "in_flight": drain["in_flight"],
        "source": drain["source"],
    }


def _mw(values: list[float], fmt: str = "{:.2f}") -> str:
    """median / worst (the largest)."""
    return " / ".join(fmt.format(v) for v in (statistics.median(values), max(values)))


def markdown(rows: dict[tuple[str, str, str], list[dict[str, Any]]], reps: int, routers: list[str]) -> str:
    out = [
        f"{reps} repetition(s) per transaction and router, the official `openai` client without "
        "retries; median / worst of the repetitions.\n",
        "| router | transaction | requests | answers cut | failed by status | window s | floor s | "
        "window / floor | target (0 cut, 0 404, <= 1.5) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for router, name in itertools.product(routers, STEADY):
        runs = rows[(router, "steady", name)]
        failed: dict[str, int] = {}
        for r in runs:
            for k, v in r["failed"].items():
                failed[k] = failed.get(k, 0) + v
        ratios = [r["window_s"] / r["floor_s"] for r in runs]
        cut = sum(r["cut"] for r in runs)
        verdict = "ok" if cut == 0 and "404" not in failed and max(ratios) <= 1.5 else "**not met**"
        out.append(
            f"| {router} | {name} | {sum(r['requests'] for r in runs)} | {cut} | "
            f"{', '.join(f'{k}: {v}' for k, v in sorted(failed.items())) or 'none'} | "
            f"{_mw([r['window_s'] for r in runs])} | {_mw([r['floor_s'] for r in runs])} | "
            f"{_mw(ratios)} | {verdict} |"
        )
    out += [
        "",
        f"| router | transaction, two {STREAM_S:g} s streams in flight | answers cut | drain waited s | "
        "longest stream's remaining time at the drain's start s | counted by |",
        "|---|---|---|---|---|---|",
    ]
    for router, name in itertools.product(routers, STREAMS):
        runs = rows[(router, "streams", name)]
        waited = _mw([r["drain_waited_s"] for r in runs])
        out.append(
            f"| {router} | {name} | {sum(r['cut'] for r in runs)} | {waited} | "
            f"{_mw([r['remaining_s'] for r in runs])} | {', '.join(sorted({r['source'] for r in runs}))} |"
        )
    for router, name in itertools.product(routers, ("load --promote", "load, promote")):
        runs = sorted(rows[(router, "steady", name)], key=lambda r: r["window_s"])
        median = runs[len(runs) // 2]
        out += [
            "",
            f"Timeline of the median `{name}` window on {router} ({median['window_s']:.2f} s; seconds "
            "from the last success before it):",
            "",
            "| s | event |",
            "|---|---|",
            *(f"| {t:+.3f} | {what} |" for t, what in median["timeline"]),
        ]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--routers", default="smg,haproxy", help="comma-separated: smg, haproxy")
    parser.add_argument("--markdown-out", type=Path)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "anvil-bench-window")
    parser.add_argument(
        "--only", help="comma-separated steady transactions to run (no streams): a quick trace"
    )
    args = parser.parse_args()
    steady_names = [n.strip() for n in args.only.split(",")] if args.only else list(STEADY)
    stream_names = [] if args.only else list(STREAMS)
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    # What an installed package has (pip compiles at install); see benchmarks/paired.py.
    compileall.compile_dir(REPO / "anvil_ctl", quiet=1)
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for router in routers:
        host = ChaosHost(args.work / router, router, incumbent_engine=INCUMBENT_ENGINE[router])
        try:
            ensure_qualified(host)
            for rep in range(args.reps):
                for name in steady_names:
                    rows.setdefault((router, "steady", name), []).append(steady(host, name))
                    r = rows[(router, "steady", name)][-1]
                    print(
                        f"{router} rep {rep} steady {name}: window {r['window_s']:.2f} floor "
                        f"{r['floor_s']:.2f} failed {r['failed']} cut {r['cut']}",
                        flush=True,
                    )
                    if args.only:
                        print("\n".join(f"  {t:+.3f} {what}" for t, what in r["timeline"]), flush=True)
                for name in stream_names:
                    rows.setdefault((router, "streams", name), []).append(streams(host, name))
                    print(
                        f"{router} rep {rep} streams {name}: {rows[(router, 'streams', name)][-1]}",
                        flush=True,
                    )
        finally:
            host.stop()
            _remove_containers()
    if args.only:
        return 0
    text = markdown(rows, args.reps, routers)
    print(text)
    if args.markdown_out:
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text(text)
    return 0


def _remove_containers() -> None:
    """Every container of the host just measured, by ID: the next router's host binds the same port."""
    from scripts.campaign import runtime

    rt = runtime()
    try:
        for c in rt.list(labels={"io.anvil.slot": "primary"}):
            rt.remove(c.id, force=True)
    finally:
        rt.close()


if __name__ == "__main__":
    raise SystemExit(main())
