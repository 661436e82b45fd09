"""The watched promote: how soon a fault brings the incumbent back, and whether a healthy serve
is ever rolled back.

Run inside the hermetic environment (real dockerd, real smg, stub engines in containers):

    scripts/testenv run -- .venv/bin/python benchmarks/watch.py [--router smg|haproxy]
        [--intervals 1,5] [--reps 3]
        [--kinds http-500,...] [--healthy-minutes 30] [--markdown-out F]

One campaign host (scripts/chaos.py: smg or HAProxy by `--router`, simulated GPUs, the stub
incumbent routed and adopted). Each repetition loads a candidate whose stub carries
`--late-fault KIND@Ts`, records a verified decision under a profile whose `[watch]` samples
every INTERVAL seconds (2 short streamed chats; a breach is 2 failing samples in a row) and
runs `anvilctl promote --watch` while a client polls the route with the official `openai`
client (no retries). Measured:

- onset: the stub's own wall-clock report (`GET /anvil/sim/timings` on the slot's binding,
  polled beside the route): when the fault first acted (the first completion it changed, the
  fatal line, the exit), else when it was due (its start plus T). A repetition whose onset
  came before the watch began is reported, not counted.
- detection: onset -> the promote's `rolled_back` state journaled (the breach verdict);
  against the interval, whose floor is one sample after the onset plus `consecutive - 1`
  intervals.
- onset-to-serving: onset -> the polling client's first answer from the incumbent; its part
  after the verdict is set against a person's `anvilctl rollback` timed the same way in the
  same run (command start -> the incumbent answering through the route).

Then a healthy watch of `--healthy-minutes` on an unfaulted candidate: rollbacks (must be 0),
samples, breaches, and the worst values seen against the limits. Each run also writes its
rows as JSON beside the markdown; `--merge A.json B.json` renders runs made apart (the
healthy watch in one hermetic environment, the faults in another) into one section.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
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

import httpx
import openai

from scripts.campaign import INCUMBENT_MODEL, verified_decision
from scripts.chaos import ALIAS, ChaosHost
from tests.integration.test_load_docker import variant

FAULTS = {
    "slow-first-token:2.5": "ttft_p95_s",
    "slow-decode:20": "decode_tps_p50",
    "http-500": "error_rate",
    "truncate-stream": "finish_reason_missing",
    "fatal-log": "fatal_log_lines",
    "exit": "container_down",
}
"""Each fault, and the limit it must breach."""

LIMITS = {
    "ttft_p95_s": ("max", 1.5),
    "decode_tps_p50": ("min", 200),
    "error_rate": ("max", 0),
    "finish_reason_missing": ("max", 0),
    "restarts": ("max", 0),
    "container_down": ("max", 0),
    "fatal_log_lines": ("max", 0),
}
CONSECUTIVE = 2
RECIPE = "watch-bench"
BINDING = "http://127.0.0.1:8001"
"""The slot's binding: the candidate's stub while it serves, its timings and onsets."""


def profile_text(interval_s: float) -> str:
    lines = [
        'name = "watch-bench"',
        "[[gates]]",
        'type = "smoke"',
        "[watch]",
        'duration = "10m"',
        f"interval_s = {interval_s}",
        "requests = 2",
        "max_tokens = 8",
        f"consecutive = {CONSECUTIVE}",
    ]
    for metric, (op, value) in LIMITS.items():
        lines += ["[[watch.thresholds]]", f'metric = "{metric}"', f"{op} = {value}"]
    return "\n".join(lines) + "\n"


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class Poller:
    """Short chats through the route, one after another, noting who answered and when."""

    host: ChaosHost
    seen: list[tuple[float, str]] = field(default_factory=list)
    onsets: list[dict[str, Any]] = field(default_factory=list)
    """The newest late-fault onsets the stub on the binding reported (its faults, if any)."""
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = openai.OpenAI(
            base_url=self.host.camp.router.url + "/v1",
            api_key=self.host.camp.client_token,
            max_retries=0,
            timeout=2.0,
        )
        while not self.stop.is_set():
            try:
                answer = client.chat.completions.create(
                    model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                who = answer.model
            except openai.APIStatusError as exc:
                who = str(exc.status_code)
            except openai.APIConnectionError:
                who = "cut"
            self.seen.append((time.time(), who))
            self.onsets = stub_onsets() or self.onsets
            self.stop.wait(0.1)

    def incumbent_after(self, t: float) -> float | None:
        return next((at for at, who in self.seen if at >= t and who == INCUMBENT_MODEL), None)

    def __enter__(self) -> Poller:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def stub_onsets() -> list[dict[str, Any]]:
    """The late-fault onsets of the stub on the binding ([] when none answers)."""
    try:
        found: list[dict[str, Any]] = httpx.get(f"{BINDING}/anvil/sim/timings", timeout=1).json()["onsets"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
    return found


class Bench:
    def __init__(self, work: Path, router: str) -> None:
        self.work = work
        self.router = router
        self.host = ChaosHost(work / "host", router)
        self.recipes = work / "recipes"
        self.recipes.mkdir(parents=True, exist_ok=True)
        self.env = {**self.host.camp.env, "ANVIL_RECIPES_DIR": str(self.recipes)}
        self.decisions = itertools.count(1)

    def anvilctl(self, *args: str, timeout_s: float = 600) -> dict[str, Any]:
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "--json", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        out: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
        out["_exit"] = r.returncode
        out["_stderr"] = r.stderr[-2000:]
        return out

    def load(self, stub_args: list[str], interval_s: float) -> str:
        """From the incumbent serving: a candidate of `stub_args`, verified under the watch
        profile of `interval_s`; its container ID."""
        self.host.prepare("load")
        self.host.unload_stopped_candidates()
        variant(self.recipes, RECIPE, stub_args)
        out = self.anvilctl("load", RECIPE, "--slot", "primary")
        assert out.get("state") == "committed", out
        profile = self.work / f"watch-{interval_s:g}s.toml"
        profile.write_text(profile_text(interval_s))
        # A decision of its own each time: the newest names the profile, hence the interval.
        decision = f"bench-{next(self.decisions)}-{{digest}}"
        verified_decision(self.host.app().store, "primary", decision, profile=str(profile))
        cand = self.host.candidate
        assert cand is not None
        return cand

    def took(self, tx_id: str) -> float:
        """A transaction's journaled length: its first state to its last."""
        states = self.anvilctl("audit", "show", tx_id)["states"]
        return _at(states[-1]["at"]) - _at(states[0]["at"])

    @staticmethod
    def onset(onsets: list[dict[str, Any]], kind: str) -> tuple[float, str]:
        """The fault's onset by the stub's own clock: when it first acted, else when it was due."""
        name = kind.split(":", maxsplit=1)[0]
        found = next(o for o in onsets if o["kind"] == name)
        if found.get("began_at") is not None:
            return float(found["began_at"]), "the stub: first acted"
        return float(found["due_at"]), "the stub: due (start + T)"

    def fault(self, kind: str, interval_s: float, after_s: float) -> dict[str, Any]:
        self.load(["--late-fault", f"{kind}@{after_s:g}s"], interval_s)
        with Poller(self.host, onsets=stub_onsets()) as poller:
            out = self.anvilctl("promote", "--slot", "primary", "--approved-by", "bench", "--watch", "90s")
            end = time.monotonic() + 60
            while time.monotonic() < end and poller.incumbent_after(0) is None:
                time.sleep(0.1)
            time.sleep(0.3)
        tx = str(out.get("tx_id"))
        shown = self.anvilctl("audit", "show", tx)
        events = [e for e in shown["steps"] if e["step"] == "watch"]
        begin = next((e["detail"] for e in events if e["event"] == "begin"), None)
        if begin is None:  # the fault came before the watch: the promote itself refused or failed
            why = f"promote ended {shown['states'][-1]['state']} before its watch: {out.get('reason')}"
            return {"kind": kind, "interval_s": interval_s, "valid": False, "why": why}
        began = float(begin["since"])
        samples = [e["detail"] for e in events if e["event"] == "sample"]
        onset, onset_from = self.onset(poller.onsets, kind)
        row: dict[str, Any] = {
            "kind": kind,
            "interval_s": interval_s,
            "state": shown["states"][-1]["state"],
            "onset_from": onset_from,
            "onset_after_watch_began_s": onset - began,
            "samples": len(samples),
        }
        if row["state"] != "rolled_back":
            return {**row, "valid": False, "why": f"promote ended {row['state']}: {out.get('reason')}"}
        verdict = _at(shown["states"][-1]["at"])
        breached = shown["states"][-1]["data"].get("watch", {}).get("breaches", [])
        serving = poller.incumbent_after(verdict)
        follow = shown["states"][-1]["data"].get("followed_by") or {}
        spacing = [b["at"] - a["at"] for a, b in itertools.pairwise(samples)]
        return {
            **row,
            "valid": onset > began and serving is not None,
            "why": "" if onset > began else "the fault began before the watch",
            "breached": sorted({b["metric"] for b in breached}),
            "expected": FAULTS[kind] in {b["metric"] for b in breached},
            "detection_s": verdict - onset,
            "serving_s": (serving - onset) if serving is not None else None,
            "after_verdict_s": (serving - verdict) if serving is not None else None,
            "spacing_s": statistics.median(spacing) if spacing else None,
            "rollback_tx_s": self.took(str(follow["tx_id"])) if follow.get("tx_id") else None,
        }

    def hand_rollback(self) -> dict[str, Any]:
        """A person's rollback from the promoted candidate, timed as the watch's recovery is."""
        self.load([], 5.0)
        out = self.anvilctl("promote", "--slot", "primary", "--approved-by", "bench", "--watch", "0")
        assert out.get("state") == "committed", out
        with Poller(self.host) as poller:
            time.sleep(0.5)
            t0 = time.time()
            back = self.anvilctl("rollback", "--slot", "primary")
            end = time.monotonic() + 60
            while time.monotonic() < end and poller.incumbent_after(t0) is None:
                time.sleep(0.1)
        assert back.get("state") == "committed", back
        serving = poller.incumbent_after(t0)
        return {
            "serving_s": None if serving is None else serving - t0,
            "rollback_tx_s": self.took(str(back["tx_id"])),
        }

    def healthy(self, minutes: float, interval_s: float) -> dict[str, Any]:
        self.load([], interval_s)
        t0 = time.time()
        out = self.anvilctl(
            "promote",
            "--slot",
            "primary",
            "--approved-by",
            "bench",
            "--watch",
            f"{minutes * 60:g}s",
            timeout_s=minutes * 60 + 600,
        )
        shown = self.anvilctl("audit", "show", str(out.get("tx_id")))
        samples = [e["detail"] for e in shown["steps"] if e["step"] == "watch" and e["event"] == "sample"]
        rollbacks = [
            t
            for t in self.anvilctl("audit", "transactions", "--limit", "20").get("transactions", [])
            if t["kind"] == "rollback" and _at(t["created_at"]) >= t0
        ]
        worst: dict[str, float | None] = {}
        outside: dict[str, int] = {}  # samples past a limit alone, not `consecutive` in a row
        for metric, (op, limit) in LIMITS.items():
            values = [s["metrics"].get(metric) for s in samples]
            known = [float(v) for v in values if isinstance(v, int | float)]
            worst[metric] = (max(known) if op == "max" else min(known)) if known else None
            outside[metric] = sum(1 for v in known if (v > limit if op == "max" else v < limit))
        return {
            "minutes": minutes,
            "interval_s": interval_s,
            "state": out.get("state"),
            "reason": out.get("reason"),
            "samples": len(samples),
            "breaches": len(shown["states"][-1]["data"].get("watch", {}).get("breaches", [])),
            "rollbacks": len(rollbacks) + (out.get("state") == "rolled_back" and not rollbacks),
            "worst": worst,
            "outside": {m: n for m, n in outside.items() if n},
        }

    def close(self) -> None:
        self.host.stop()


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    return " / ".join(fmt.format(v) for v in (statistics.median(values), max(values)))


def markdown(rows: dict[str, Any]) -> str:
    out: list[str] = []
    for r in rows.get("faults", []):
        if r.get("valid") and r["detection_s"] < 0:  # the verdict came before the fault began
            r["valid"] = False
            r["why"] = (
                f"a false rollback {-r['detection_s']:.1f} s before the onset (breached {r['breached']})"
            )
        spacing = r.get("spacing_s")
        if r.get("valid") and spacing is not None and not 0.5 <= spacing / r["interval_s"] <= 1.5:
            r["valid"], r["why"] = False, f"it sampled every {spacing:.1f} s, not every {r['interval_s']:g} s"
    faults = [r for r in rows.get("faults", []) if r.get("valid")]
    dropped = [r for r in rows.get("faults", []) if not r.get("valid")]
    hand = [r["serving_s"] for r in rows.get("hand", []) if r.get("serving_s") is not None]
    hand_tx = [r["rollback_tx_s"] for r in rows.get("hand", []) if r.get("rollback_tx_s") is not None]
    if rows.get("faults"):
        out += [
            f"Real {rows.get('router', 'smg')}, the stub's late faults starting by time, the official "
            f"`openai` client polling the route every 0.1 s; a sample is 2 streamed chats, a breach "
            f"{CONSECUTIVE} failing samples in a row. Median / worst. Detection: the onset -> the "
            "breach verdict journaled "
            f"(floor: the rest of the sample under way, one more sample, {CONSECUTIVE - 1} "
            "interval(s)). Recovery: the verdict -> the incumbent answering through the route. "
            "Baseline, in the same run: a person's `anvilctl rollback` from the promoted candidate, "
            f"command start -> the incumbent answering {_span(hand)} s (its transaction "
            f"{_span(hand_tx)} s), {len(hand)} runs.\n",
            "| fault (limits breached) | interval s | runs | detection s | detection / interval | "
            "onset -> serving s | recovery s | recovery / a person's rollback | "
            "its rollback transaction s | sample spacing s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        keys = sorted(
            {(r["kind"], r["interval_s"]) for r in faults}, key=lambda k: (list(FAULTS).index(k[0]), k[1])
        )
        for kind, interval in keys:
            runs = [r for r in faults if (r["kind"], r["interval_s"]) == (kind, interval)]
            det = [r["detection_s"] for r in runs]
            after = [r["after_verdict_s"] for r in runs]
            rec = [a / statistics.median(hand) for a in after] if hand else []
            metrics = sorted({m for r in runs for m in r["breached"]})
            unexpected = any(not r["expected"] for r in runs)
            label = f"{kind} ({', '.join(metrics)}{'; expected ' + FAULTS[kind] if unexpected else ''})"
            out.append(
                f"| {label} | {interval:g} | {len(runs)} | {_span(det)} | "
                f"{_span([d / interval for d in det])} | {_span([r['serving_s'] for r in runs])} | "
                f"{_span(after)} | {_span(rec)} | "
                f"{_span([r['rollback_tx_s'] for r in runs if r.get('rollback_tx_s') is not None])} | "
                f"{_span([r['spacing_s'] for r in runs if r['spacing_s'] is not None])} |"
            )
        if dropped:
            out.append("")
            out += [f"Not counted: {r['kind']} at {r['interval_s']:g} s ({r['why']})." for r in dropped]
        out.append("")
    h = rows.get("healthy")
    if h:
        worst = h["worst"]
        seen = ", ".join(
            f"{m} {'-' if worst.get(m) is None else f'{worst[m]:.4g}'} ({op} {lim:g})"
            for m, (op, lim) in LIMITS.items()
        )
        verdict = "ok" if h["rollbacks"] == 0 and h["state"] == "committed" else "**not met**"
        out += [
            "| healthy watch | interval s | samples | breaches | rollbacks | ended | target |",
            "|---|---|---|---|---|---|---|",
            f"| {h['minutes']:g} min | {h['interval_s']:g} | {h['samples']} | {h['breaches']} | "
            f"{h['rollbacks']} | {h['state']} | 0 rollbacks: {verdict} |",
            "",
            f"Worst sample of the healthy watch against its limits: {seen}. Samples past a limit "
            f"alone (never {CONSECUTIVE} in a row): "
            f"{', '.join(f'{m} {n}' for m, n in h.get('outside', {}).items()) or 'none'}. "
            f"Load average at its end {h.get('load', '-')}.",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", choices=("smg", "haproxy"), default="smg")
    parser.add_argument("--intervals", default="1,5", help="sample intervals, seconds")
    parser.add_argument("--kinds", default=",".join(FAULTS), help="late faults (empty: none)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--onset-s", type=float, default=20.0, help="the fault's onset after its stub started"
    )
    parser.add_argument("--healthy-minutes", type=float, default=30.0, help="0: no healthy watch")
    parser.add_argument("--healthy-interval", type=float, default=5.0)
    parser.add_argument("--markdown-out", type=Path)
    parser.add_argument("--merge", type=Path, nargs="+", help="render these JSON rows, run nothing")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "anvil-bench-watch")
    args = parser.parse_args()
    rows: dict[str, Any] = {}
    if args.merge:
        for path in args.merge:  # the lists of several runs add up
            for key, value in json.loads(path.read_text()).items():
                rows[key] = rows.get(key, []) + value if isinstance(value, list) else value
    else:
        bench = Bench(args.work, args.router)
        rows["router"] = args.router
        kinds = [k for k in args.kinds.split(",") if k]
        try:
            if kinds and args.reps:
                rows["hand"] = [bench.hand_rollback() for _ in range(args.reps)]
                print("hand", rows["hand"], flush=True)
                for _ in range(args.reps):
                    for interval in (float(i) for i in args.intervals.split(",")):
                        for kind in kinds:
                            row = bench.fault(kind, interval, args.onset_s)
                            rows.setdefault("faults", []).append(row)
                            print(json.dumps(row), flush=True)
            if args.healthy_minutes > 0:
                rows["healthy"] = bench.healthy(args.healthy_minutes, args.healthy_interval)
                rows["healthy"]["load"] = " / ".join(f"{v:.1f}" for v in os.getloadavg())
                print(json.dumps(rows["healthy"]), flush=True)
        finally:
            bench.close()
    text = markdown(rows)
    print(text)
    if args.markdown_out:
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text(text)
        if not args.merge:
            args.markdown_out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
