"""The seeds' summary table of a qualification, as text and as a rich table."""

from __future__ import annotations

import io

from rich.console import Console

from anvil_ctl.evidence.summary import context_label, render_summary, summary_rows, summary_table
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
        rows = summary_rows([CAPACITY.evidence, ENDURANCE.evidence])
        assert [r.label for r in rows] == ["4K", "4K endurance"]
        text = render_summary(rows)
        assert "2,969" in text and "0.179 s" in text and "16,545 tok/s" in text
        assert "108.57 tok/s" in text and "60/60" in text

    def test_the_rich_table_has_a_row_per_summary_row(self) -> None:
        table = summary_table(summary_rows([CAPACITY.evidence, ENDURANCE.evidence]))
        assert table.row_count == 2
        out = io.StringIO()
        Console(file=out, width=160).print(table)
        assert "Measured prompt p50" in out.getvalue()

    def test_context_labels(self) -> None:
        assert [context_label(n) for n in (4096, 122880, 1000)] == ["4K", "120K", "1000"]
