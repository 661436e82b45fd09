"""Timing a library call on a noisy machine: the fastest of several runs, and its database time.

`rollback --dry-run` reads the fake world's file (which the fakes rewrite) and runs on a
shared, loaded machine: one run's wall time says little. `timed_runs` reports the
minimum (and median) of `runs` wall times, and beside them the time spent inside
SQLite (every `sqlite3` C call: execute, fetch, commit, connect), measured on as many
further runs under cProfile (which slows the Python around those calls, not the calls),
so a growth with history shows in the database time even when the wall time is noise.
"""

from __future__ import annotations

import cProfile
import statistics
import time
from collections.abc import Callable
from typing import Any


def sqlite_seconds(fn: Callable[[], Any]) -> float:
    """Seconds `fn` spent in `sqlite3`'s C functions (statements, fetches, commits)."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        fn()
    finally:
        profile.disable()
    # a C function's entry names it as text ("<method 'execute' of 'sqlite3.Cursor' objects>")
    return sum(e.inlinetime for e in profile.getstats() if "sqlite3" in str(e.code))


def timed_runs(fn: Callable[[], Any], runs: int = 5) -> dict[str, float]:
    """Wall seconds (min, median) of `runs` runs and SQLite seconds (min, median) of `runs` more."""
    wall: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - started)
    db = [sqlite_seconds(fn) for _ in range(runs)]
    return {
        "runs": runs,
        "min_s": min(wall),
        "median_s": statistics.median(wall),
        "db_min_s": min(db),
        "db_median_s": statistics.median(db),
    }
