"""The client's view of a transaction: what a client of the router sees while the slot's serve changes.

Run inside the hermetic environment (real dockerd, real smg, stub engines in containers):

    scripts/testenv run -- .venv/bin/python benchmarks/window.py [--reps 2] [--markdown-out F]

One campaign host (scripts/chaos.py: smg, simulated GPUs, the stub incumbent routed and
adopted). Two transactions change what the router serves: the swap `load` + `promote`
(incumbent -> candidate; a committed load leaves the tier drained until promote routes
the candidate) and `rollback` (candidate -> incumbent). Each runs twice per repetition,
under two client loads, through the router with the official `openai` client (no retries):

- steady: short requests one after another. Counted: answers cut (a request that broke
  off), failed requests by status, and the window: the longest time between two successful
  answers. Its floor is what no controller can avoid on one GPU: the old serve's stop
  plus the next serve's start and readiness, read from the same transaction's journal
  (stop step minus its drain wait, start, health).
- streams: two streams that outlast the router's removal started before the transaction.
  Counted: answers cut (no finish_reason), and how long the drain waited against the
  longest stream's remaining time when the drain began (by the stub's schedule).
"""

from __future__ import annotations

import argparse
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

import itertools

import openai

from scripts.chaos import ALIAS, ChaosHost

TOKENS_PER_S = 1000  # the stub recipes' decode rate
STREAM_S = 20.0


@dataclass
class Ask:
    started: float
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
        while not self.stop.is_set():
            t0 = time.monotonic()
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
            self.asks.append(Ask(t0, time.monotonic(), status))
            if status != 200:
                time.sleep(0.05)


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def floor_s(host: ChaosHost, tx_id: str) -> float:
    """The old serve's stop (without its drain wait), the next one's start and readiness."""
    shown = host.run("audit", "show", tx_id)
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


def swap(host: ChaosHost, name: str) -> list[dict[str, Any]]:
    """Run the transaction(s) of `name` from the phase it starts in; their JSON outcomes."""
    if name == "load+promote":
        host.prepare("load")
        host.unload_stopped_candidates()
        first = host.run(*host.argv("load"))
        host.verify_candidate()
        return [first, host.run(*host.argv("promote"))]
    return [host.run(*host.argv("rollback", to_promoted(host)))]


def to_promoted(host: ChaosHost) -> str:
    """Bring the host to the promoted candidate (C), where a rollback brings back the incumbent."""
    phase = host.prepare("rollback")
    if phase == "A":
        swap(host, "load+promote")
        phase = host.prepare("rollback")
    assert phase == "C", f"rollback is measured from the promoted candidate, not {phase}"
    return phase


def steady(host: ChaosHost, name: str) -> dict[str, Any]:
    client = Client(host)
    asker = threading.Thread(target=client.run, daemon=True)
    if name == "rollback":
        to_promoted(host)
    else:
        host.prepare("load")
        host.unload_stopped_candidates()
    asker.start()
    time.sleep(1.0)
    outs = swap(host, name)
    end = time.monotonic() + 10
    while time.monotonic() < end and not (client.asks and client.asks[-1].status == 200):
        time.sleep(0.05)
    time.sleep(0.5)
    client.stop.set()
    asker.join(60)
    assert all(o.get("state") == "committed" for o in outs), [o.get("reason") for o in outs]
    ok = [a.ended for a in client.asks if a.status == 200]
    window = max((b - a for a, b in itertools.pairwise(ok)), default=float("nan"))
    failed: dict[str, int] = {}
    for a in client.asks:
        if a.status not in (200, "cut"):
            failed[str(a.status)] = failed.get(str(a.status), 0) + 1
    floor = floor_s(host, str(outs[0]["tx_id"]))
    return {
        "requests": len(client.asks),
        "cut": sum(1 for a in client.asks if a.status == "cut"),
        "failed": failed,
        "window_s": window,
        "floor_s": floor,
    }


def streams(host: ChaosHost, name: str) -> dict[str, Any]:
    if name == "rollback":
        to_promoted(host)
    else:
        host.prepare("load")
        host.unload_stopped_candidates()
    ends: list[tuple[str | None, float]] = []
    started = threading.Barrier(3)

    def one() -> None:
        client = openai.OpenAI(
            base_url=host.camp.router.url + "/v1", api_key=host.camp.client_token, max_retries=0, timeout=120
        )
        finish: str | None = None
        try:
            chunks = client.chat.completions.create(
                model=ALIAS,
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
        ends.append((finish, time.time()))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(30)
    first_chunk = time.time()
    outs = swap(host, name)
    for t in threads:
        t.join(180)
    first = outs[0]
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
        "cut": sum(1 for f, _ in ends if f is None),
        "drain_waited_s": float(drain["waited_s"]),
        "remaining_s": remaining,
        "in_flight": drain["in_flight"],
        "source": drain["source"],
    }


def markdown(rows: dict[str, list[dict[str, Any]]], reps: int) -> str:
    out = [
        f"{reps} repetition(s) per transaction, real smg, the official `openai` client without "
        "retries; min / median / max where repeated.\n",
        "| transaction (smg) | requests | answers cut | failed by status | window s | floor s | "
        "window / floor | target |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def span(values: list[float], fmt: str = "{:.2f}") -> str:
        return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))

    for name in ("load+promote", "rollback"):
        runs = rows[f"steady {name}"]
        failed: dict[str, int] = {}
        for r in runs:
            for k, v in r["failed"].items():
                failed[k] = failed.get(k, 0) + v
        ratios = [r["window_s"] / r["floor_s"] for r in runs]
        cut = sum(r["cut"] for r in runs)
        has_404 = "404" in failed
        verdict = "ok" if cut == 0 and not has_404 and max(ratios) <= 1.5 else "**not met**"
        out.append(
            f"| {name} | {sum(r['requests'] for r in runs)} | {cut} | "
            f"{', '.join(f'{k}: {v}' for k, v in sorted(failed.items())) or 'none'} | "
            f"{span([r['window_s'] for r in runs])} | {span([r['floor_s'] for r in runs])} | "
            f"{span(ratios)} | 0 cut, 0 404, <= 1.5: {verdict} |"
        )
    out += [
        "",
        "| transaction (smg), two 20 s streams in flight | answers cut | drain waited s | "
        "longest stream's remaining time at the drain's start s | counted by |",
        "|---|---|---|---|---|",
    ]
    for name in ("load+promote", "rollback"):
        runs = rows[f"streams {name}"]
        out.append(
            f"| {name} | {sum(r['cut'] for r in runs)} | {span([r['drain_waited_s'] for r in runs])} | "
            f"{span([r['remaining_s'] for r in runs])} | {runs[0]['source']} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--markdown-out", type=Path)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "anvil-bench-window")
    args = parser.parse_args()
    host = ChaosHost(args.work)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(args.reps):
            for name in ("load+promote", "rollback"):
                rows.setdefault(f"steady {name}", []).append(steady(host, name))
                rows.setdefault(f"streams {name}", []).append(streams(host, name))
                print(name, rows[f"steady {name}"][-1], rows[f"streams {name}"][-1], flush=True)
    finally:
        host.stop()
    text = markdown(rows, args.reps)
    print(text)
    if args.markdown_out:
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
