"""Capacity accuracy: the capacity gate's figures against what the stub really emitted.

Starts the stub engine on 127.0.0.1 with --prefill-tps/--decode-tps and runs the
capacity gate (streamed, usage from the engine) one cell at a time. The ground truth
of each cell is the stub's own measurement of the same requests
(`GET /anvil/sim/timings`: request read -> first token -> last token), not the
configured rate: on a loaded host the stub's sleeps overshoot, the rates it achieves
drop below the configured ones, and a client that measures them exactly is right.
The error is the ratio measured / truth - 1 of the p50s, per cell; exits 1 when any
exceeds --tolerance (2 % by default). The configured rates and the error against
them are printed beside it, for information only.

    .venv/bin/python benchmarks/capacity_accuracy.py [--prefill-tps 8000 --decode-tps 100]
    .venv/bin/python benchmarks/capacity_accuracy.py --markdown-out out.md   # for RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.capacity import Capacity
from anvil_ctl.qualify.results import GateResult

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_stub(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "anvil_stub",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model",
        "bench",
        "--max-model-len",
        str(max(args.contexts) + 1024),
        "--prefill-tps",
        str(args.prefill_tps),
        "--decode-tps",
        str(args.decode_tps),
        "--verbose-default",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.terminate()
    raise SystemExit("stub did not become healthy")


async def measure(url: str, args: argparse.Namespace, context: int, concurrency: int) -> GateResult:
    gate = Capacity(
        contexts=[context],
        concurrency=[concurrency],
        repetitions=args.repetitions,
        output_tokens=args.output_tokens,
    )
    async with EngineClient(url) as client:
        return await gate(GateContext(client=client, served_model="bench", thinking=False))


def timings(url: str, after: int) -> list[dict[str, Any]]:
    """The stub's measured timings of the completions numbered above `after`."""
    rows: list[dict[str, Any]] = httpx.get(f"{url}/anvil/sim/timings", timeout=10).json()["timings"]
    return [r for r in rows if r["seq"] > after]


def truth(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """p50 prefill and decode tok/s of what the stub really emitted, defined as the gate defines them."""
    prefill = [r["prompt_tokens"] / r["prefill_s"] for r in rows if r["prefill_s"] > 0]
    decode = [(r["tokens"] - 1) / r["decode_s"] for r in rows if r["tokens"] > 1 and r["decode_s"] > 0]
    return statistics.median(prefill), statistics.median(decode)


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    """Every cell's measured and true rates; False when the gate itself failed."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_stub(args, port)
    cells: list[dict[str, Any]] = []
    try:
        for context in args.contexts:
            for concurrency in args.concurrency:
                seen = max([0, *(r["seq"] for r in timings(url, 0))])
                result = asyncio.run(measure(url, args, context, concurrency))
                if not result.passed:
                    print(f"capacity gate failed: {result.classification} {result.summary}")
                    return cells, False
                (cell,) = result.evidence["cells"]
                true_prefill, true_decode = truth(timings(url, seen))
                cells.append(
                    {
                        "cell": f"{context_label(cell['nominal_tokens'])}/C{cell['concurrency']}",
                        "prompt_tokens": cell["prompt_tokens_p50"],
                        "prefill": cell["prefill_tps_p50"],
                        "prefill_truth": true_prefill,
                        "decode": cell["decode_tps_p50"],
                        "decode_truth": true_decode,
                        "requests": f"{cell['completed']}/{cell['requests']}",
                    }
                )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return cells, True


def error(measured: float, true: float) -> float:
    return measured / true - 1


def report(args: argparse.Namespace, cells: list[dict[str, Any]], markdown: bool) -> tuple[str, float]:
    """The table, and the worst error against the truth."""
    worst = 0.0
    cfg_pre, cfg_dec = args.prefill_tps, args.decode_tps
    lines: list[str] = []
    if markdown:
        lines += [
            f"Stub configured at prefill {cfg_pre:,.0f} tok/s and decode {cfg_dec:,.2f} tok/s; each cell "
            f"{args.repetitions} repetitions of {args.output_tokens} output tokens.",
            "",
            "| cell | prefill p50 (truth) | error | decode p50 (truth) | error | "
            "vs configured prefill / decode |",
            "|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            f"configured: prefill {cfg_pre:,.0f} tok/s, decode {cfg_dec:,.2f} tok/s",
            f"{'cell':<9} {'prefill p50':>11} {'truth':>9} {'error':>7}  {'decode p50':>10} {'truth':>7} "
            f"{'error':>7}  {'vs configured':>17}",
        ]
    for c in cells:
        e_pre, e_dec = error(c["prefill"], c["prefill_truth"]), error(c["decode"], c["decode_truth"])
        worst = max(worst, abs(e_pre), abs(e_dec))
        configured = f"{error(c['prefill'], cfg_pre):+.2%} / {error(c['decode'], cfg_dec):+.2%}"
        if markdown:
            lines.append(
                f"| {c['cell']} | {c['prefill']:,.1f} ({c['prefill_truth']:,.1f}) | {e_pre:+.2%} | "
                f"{c['decode']:.2f} ({c['decode_truth']:.2f}) | {e_dec:+.2%} | {configured} |"
            )
        else:
            lines.append(
                f"{c['cell']:<9} {c['prefill']:>11,.1f} {c['prefill_truth']:>9,.1f} {e_pre:>+7.2%}  "
                f"{c['decode']:>10.2f} {c['decode_truth']:>7.2f} {e_dec:>+7.2%}  {configured:>17}"
            )
    verdict = "OK" if worst <= args.tolerance else "FAIL"
    line = (
        f"worst error against the stub's measured truth {worst:.3%} "
        f"(tolerance {args.tolerance:.0%}): {verdict}"
    )
    lines += ["", line] if markdown else [line]
    return "\n".join(lines), worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-tps", type=float, default=8000.0)
    parser.add_argument("--decode-tps", type=float, default=100.0)
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--markdown-out", type=Path, help="also write the table as Markdown here")
    args = parser.parse_args()
    cells, ok = run(args)
    if not ok:
        return 1
    text, worst = report(args, cells, markdown=False)
    print(text)
    if args.markdown_out:
        args.markdown_out.write_text(report(args, cells, markdown=True)[0] + "\n")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
