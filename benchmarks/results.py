"""Assemble benchmarks/RESULTS.md from the sections `make bench` wrote into a directory.

    .venv/bin/python benchmarks/results.py benchmarks/out > benchmarks/RESULTS.md

Sections (each optional, in this order): paired.md (benchmarks/paired.py), scale.md
(benchmarks/scale.py), capacity.md (benchmarks/capacity_accuracy.py), window.md
(benchmarks/window.py).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SECTIONS = (
    (
        "paired.md",
        "anvilctl against the bare sequence",
        "`scripts/testenv run -- .venv/bin/python benchmarks/paired.py`: real dockerd, stub engines in "
        "containers, real smg; the bare sequence is the same parts written plainly (Docker SDK and "
        "httpx, in-process, polling every 50 ms). Read the ratios: the machine is shared and loaded.",
    ),
    (
        "scale.md",
        "At scale: state databases of real transactions",
        "`.venv/bin/python benchmarks/scale.py`: copies of a real promote, rollback and load on the "
        "shipped fakes; library calls timed in-process (median), commands as processes.",
    ),
    (
        "capacity.md",
        "Capacity fidelity",
        "`.venv/bin/python benchmarks/capacity_accuracy.py`: the capacity gate against what the stub "
        "really emitted (its measured ground truth), so the error holds on a loaded machine.",
    ),
    (
        "window.md",
        "What a client sees while the serve changes",
        "`scripts/testenv run -- .venv/bin/python benchmarks/window.py`: real dockerd, stub engines in "
        "containers, real smg and real HAProxy, the official `openai` client through the router; the "
        "window's floor (old stop + new start + readiness) read from the same transaction's journal.",
    ),
)


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "benchmarks" / "out")
    load = os.getloadavg()
    print("# Benchmark results\n")
    print(
        f"`make bench` at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} when written.\n"
    )
    for name, title, how in SECTIONS:
        path = out / name
        print(f"## {title}\n\n{how}\n")
        print(path.read_text().rstrip() if path.exists() else f"(not run: no {path})")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
