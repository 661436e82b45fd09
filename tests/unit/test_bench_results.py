"""RESULTS.md assembly: a benchmark re-run alone replaces its own section and keeps the others;
the watch benchmark's table says what its rows measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.results import REPO, SECTIONS
from benchmarks.watch import markdown


def _results(out: Path, *extra: str) -> str:
    script = REPO / "benchmarks" / "results.py"
    r = subprocess.run([sys.executable, str(script), str(out), *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


class TestKeep:
    def test_a_section_run_alone_replaces_its_own_and_keeps_the_others(self, tmp_path: Path) -> None:
        first = tmp_path / "first"
        first.mkdir()
        for name, _title, _how in SECTIONS:
            (first / name).write_text(f"old table of {name}\n")
        earlier = tmp_path / "RESULTS.md"
        earlier.write_text(_results(first))
        again = tmp_path / "again"
        again.mkdir()
        (again / "watch.md").write_text("new table of watch.md\n")
        text = _results(again, "--keep", str(earlier))
        assert "new table of watch.md" in text and "old table of watch.md" not in text
        for name, _title, _how in SECTIONS[:-1]:
            assert text.count(f"old table of {name}") == 1, name
        assert "Re-run alone" in text and text.count("`make bench` at") == 1

    def test_without_keep_a_section_not_run_says_so(self, tmp_path: Path) -> None:
        text = _results(tmp_path)
        assert text.count("(not run: no ") == len(SECTIONS)


def _fault(detection: float, after: float) -> dict[str, object]:
    return {
        "kind": "http-500",
        "interval_s": 5.0,
        "valid": True,
        "breached": ["error_rate"],
        "expected": True,
        "detection_s": detection,
        "serving_s": detection + after,
        "after_verdict_s": after,
        "rollback_tx_s": after,
        "spacing_s": 5.0,
    }


class TestWatchTable:
    def test_detection_is_set_against_the_interval_and_recovery_against_a_persons_rollback(self) -> None:
        rows = {
            "hand": [{"serving_s": 8.0, "rollback_tx_s": 6.0}],
            "faults": [
                _fault(7.5, 4.0),
                _fault(10.0, 2.0),
                {
                    "kind": "exit",
                    "interval_s": 5.0,
                    "valid": False,
                    "why": "the fault began before the watch",
                },
                {**_fault(1.0, 1.0), "spacing_s": 1.0},
            ],
        }
        text = markdown(rows)
        (row,) = [line for line in text.splitlines() if line.startswith("| http-500")]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:6] == ["5", "2", "8.75 / 10.00", "1.75 / 2.00", "11.75 / 12.00"]
        assert cells[7] == "0.38 / 0.50"  # 3 s median recovery / 8 s, 4 s worst / 8 s
        assert "Not counted: exit at 5 s (the fault began before the watch)." in text
        assert "Not counted: http-500 at 5 s (it sampled every 1.0 s, not every 5 s)." in text

    def test_a_healthy_watch_that_rolled_back_is_not_met(self) -> None:
        worst = {"ttft_p95_s": 0.2, "decode_tps_p50": 150.0}
        healthy = {"minutes": 30, "interval_s": 5, "samples": 300, "breaches": 1, "rollbacks": 1}
        text = markdown({"healthy": {**healthy, "state": "rolled_back", "worst": worst}})
        assert "0 rollbacks: **not met**" in text
        assert "decode_tps_p50 150 (min 200)" in text
