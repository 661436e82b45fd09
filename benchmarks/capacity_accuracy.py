"""Capacity accuracy: the capacity gate's figures against the stub's configured rates.

Starts the stub engine on 127.0.0.1 with --prefill-tps/--decode-tps, runs the
capacity gate (streamed, usage from the engine), and prints measured p50 prefill
and decode beside the configured rates with the relative error. Exits 1 when any
error exceeds --tolerance (2 % by default).

    .venv/bin/python benchmarks/capacity_accuracy.py [--prefill-tps 8000 --decode-tps 100]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates import Capacity, GateContext
from anvil_ctl.qualify.metrics import context_label
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
        "anvil_ctl.stub",
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


async def measure(url: str, args: argparse.Namespace) -> GateResult:
    gate = Capacity(
        contexts=args.contexts,
        concurrency=args.concurrency,
        repetitions=args.repetitions,
        output_tokens=args.output_tokens,
    )
    async with EngineClient(url) as client:
        return await gate(GateContext(client=client, served_model="bench", thinking=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-tps", type=float, default=8000.0)
    parser.add_argument("--decode-tps", type=float, default=100.0)
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args()

    port = free_port()
    proc = start_stub(args, port)
    try:
        result = asyncio.run(measure(f"http://127.0.0.1:{port}", args))
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    if not result.passed:
        print(f"capacity gate failed: {result.classification} {result.summary}")
        return 1
    worst = 0.0
    print(f"configured: prefill {args.prefill_tps:,.0f} tok/s, decode {args.decode_tps:,.2f} tok/s")
    print(
        f"{'cell':<10} {'prompt p50':>10} {'TTFT p50':>9} {'prefill p50':>12} {'err':>7} "
        f"{'decode p50':>11} {'err':>7} {'done':>5}"
    )
    for cell in result.evidence["cells"]:
        prefill, decode = cell["prefill_tps_p50"], cell["decode_tps_p50"]
        e_pre = abs(prefill - args.prefill_tps) / args.prefill_tps
        e_dec = abs(decode - args.decode_tps) / args.decode_tps
        worst = max(worst, e_pre, e_dec)
        label = f"{context_label(cell['nominal_tokens'])}/C{cell['concurrency']}"
        print(
            f"{label:<10} {cell['prompt_tokens_p50']:>10,.0f} {cell['ttft_s_p50']:>8.3f}s "
            f"{prefill:>12,.1f} {e_pre:>6.2%} {decode:>11.2f} {e_dec:>6.2%} "
            f"{cell['completed']:>2}/{cell['requests']}"
        )
    verdict = "OK" if worst <= args.tolerance else "FAIL"
    print(f"worst relative error {worst:.3%} (tolerance {args.tolerance:.0%}): {verdict}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
