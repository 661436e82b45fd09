"""Assemble benchmarks/RESULTS.md from the sections `make bench` wrote into a directory.

    .venv/bin/python benchmarks/results.py benchmarks/out > benchmarks/RESULTS.md
    .venv/bin/python benchmarks/results.py benchmarks/out --keep benchmarks/RESULTS.md > new.md

With `--keep FILE`, a section whose file was not written this time keeps its text from FILE
(results assembled earlier), so one benchmark can be re-run alone without losing the others.

Sections (each optional, in this order): paired.md (benchmarks/paired.py), scale.md
(benchmarks/scale.py), capacity.md (benchmarks/capacity_accuracy.py), window.md
(benchmarks/window.py), watch.md (benchmarks/watch.py).
"""

from __future__ import annotations

import argparse
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
    (
        "watch.md",
        "A watched promote: a fault's detection and recovery, and false rollbacks",
        "`scripts/testenv run -- .venv/bin/python benchmarks/watch.py`: real dockerd, stub engines in "
        "containers with a late fault, real smg, `anvilctl promote --watch`, the official `openai` "
        "client polling the route; onsets from the stub's own log lines (Docker's timestamps), the "
        "verdict from the promote's journal; then one long healthy watch on the same loaded machine.",
    ),
)


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def kept_sections(path: Path) -> dict[str, str]:
    """Each `## title` of an earlier RESULTS.md -> its body, the `how` paragraph removed; its
    opening lines (when and where it ran) under the key ""."""
    hows = {title: how for _, title, how in SECTIONS}
    parts = path.read_text().split("\n## ")
    kept = {"": parts[0].removeprefix("# Benchmark results").strip()}
    for part in parts[1:]:
        title, _, body = part.partition("\n")
        body = body.strip()
        how = hows.get(title)
        if how is not None and body.startswith(how):
            body = body[len(how) :].strip()
        kept[title] = body
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / "benchmarks" / "out")
    parser.add_argument("--keep", type=Path, help="an earlier RESULTS.md: its text of sections not run")
    args = parser.parse_args()
    kept = kept_sections(args.keep) if args.keep and args.keep.exists() else {}
    load = os.getloadavg()
    ran = [title for name, title, _ in SECTIONS if (args.out / name).exists()]
    now = (
        f"at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, {os.cpu_count()} CPUs "
        f"({platform.machine()}), load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} when written"
    )
    print("# Benchmark results\n")
    if kept:
        print(f"{kept['']}\n\nRe-run alone {now}: {', '.join(ran) or 'nothing'}.\n")
    else:
        print(f"`make bench` {now}.\n")
    for name, title, how in SECTIONS:
        path = args.out / name
        print(f"## {title}\n\n{how}\n")
        if path.exists():
            print(path.read_text().rstrip())
        else:
            print(kept.get(title) or f"(not run: no {path})")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
