"""The summary table and plain progress lines."""

from __future__ import annotations

import io

from rich.console import Console

from anvil_ctl.qualify.report import (
    PlainProgress,
    RichProgress,
    make_progress,
    render_summary,
    summary_rows,
    summary_table,
)
from anvil_ctl.qualify.results import GateResult

CAPACITY = GateResult(
    "capacity",
    True,
    "functional",
    "pass",
    {
        "gate_type": "capacity",
        "cells": [
            {
                "nominal_tokens": 4096,
                "concurrency": 1,
                "requests": 3,
                "completed": 3,
                "prompt_tokens_p50": 2969,
                "ttft_s_p50": 0.179,
                "ttfo_s_p50": 0.179,
                "prefill_tps_p50": 16545.2,
                "decode_tps_p50": 108.57,
            },
            {"nominal_tokens": 389120, "concurrency": 1, "skipped": "above max_model_len"},
        ],
    },
)
ENDURANCE = GateResult(
    "endurance",
    True,
    "functional",
    "pass",
    {
        "gate_type": "endurance",
        "nominal_tokens": 4096,
        "concurrency": 1,
        "requests": 60,
        "completed": 60,
        "prompt_tokens_p50": 2969,
        "ttft_s_p50": 0.175,
        "prefill_tps_p50": 16969,
        "decode_tps_p50": 105.82,
    },
)


class TestSummary:
    def test_rows_like_the_seeds_skip_unmeasured_cells(self) -> None:
        rows = summary_rows([CAPACITY, ENDURANCE])
        assert [r.label for r in rows] == ["4K", "4K endurance"]
        text = render_summary(rows)
        assert "2,969" in text and "0.179 s" in text and "16,545 tok/s" in text
        assert "108.57 tok/s" in text and "60/60" in text

    def test_the_rich_table_has_a_row_per_summary_row(self) -> None:
        table = summary_table(summary_rows([CAPACITY, ENDURANCE]))
        assert table.row_count == 2
        out = io.StringIO()
        Console(file=out, width=160).print(table)
        assert "Measured prompt p50" in out.getvalue()


class TestProgress:
    def test_plain_lines_on_a_non_tty(self) -> None:
        stream = io.StringIO()
        progress = make_progress(stream)
        assert isinstance(progress, PlainProgress)
        progress.gate_started("tools", 2, 3)
        progress.request_done("tools", False, "call-3: bad args")
        progress.gate_finished(
            GateResult("tools", False, "functional", "bad_tool_args", summary="19/20 exact")
        )
        lines = stream.getvalue().splitlines()
        assert lines == [
            "[2/3] tools ...",
            "    tools: FAIL call-3: bad args",
            "    tools: FAIL (bad_tool_args) 19/20 exact [0.00s]",
        ]


class TestRichProgress:
    def test_a_tty_gets_rich_progress_with_colored_verdicts(self) -> None:
        class Tty(io.StringIO):
            def isatty(self) -> bool:
                return True

        stream = Tty()
        progress = make_progress(stream)
        assert isinstance(progress, RichProgress)
        progress.gate_started("ocr", 1, 1)
        progress.request_done("ocr", True, "single-anvil#1")
        progress.request_done("ocr", False, "single-heron#1")
        progress.gate_finished(GateResult("ocr", False, "functional", "wrong_answer", summary="1/2"))
        out = stream.getvalue()
        assert "ocr: FAIL" in out and "single-heron#1" in out and "1/2" in out
