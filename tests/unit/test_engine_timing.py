"""The capacity cross-check against an engine's own timing lines (llama_perf_context_print)."""

from __future__ import annotations

from datetime import UTC, datetime

from anvil_ctl.core.engine_profile import LLAMA_CPP_PYTHON
from scripts import engine_timing

assert LLAMA_CPP_PYTHON.timing is not None
TIMING = LLAMA_CPP_PYTHON.timing
T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC).timestamp()


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def block(at: float, prompt: tuple[float, int], evals: tuple[float, int], total_ms: float) -> list[str]:
    head = f"{stamp(at)} llama_perf_context_print:"
    return [
        f"{head}        load time =       0.25 ms",
        f"{head} prompt eval time = {prompt[0]:10.2f} ms / {prompt[1]:5d} tokens "
        "(   35.81 ms per token,    27.92 tokens per second)",
        f"{head}        eval time = {evals[0]:10.2f} ms / {evals[1]:5d} runs   "
        "(  194.15 ms per token,     5.15 tokens per second)",
        f"{head}       total time = {total_ms:10.2f} ms / {prompt[1] + evals[1]:5d} tokens",
    ]


def row(label: str, start: float, e2e: float, prefill: float, decode: float) -> dict[str, object]:
    return {
        "label": label,
        "completed": True,
        "started_at": T0 + start,
        "e2e_s": e2e,
        "prefill_tps": prefill,
        "decode_tps": decode,
        "prompt_tokens": 430,
    }


# Request 1: 400 tokens in 4 s, 31 steps in 1 s; its count follow-up evaluates 1 token.
# Request 2: the engine's prompt-eval time is implausibly small (0.25 ms for 400 tokens).
LOG = "\n".join(
    [
        f"{stamp(0.5)} INFO: request",
        *block(5.2, (4000.0, 400), (1000.0, 31), 5100.0),
        *block(5.4, (0.0, 1), (30.0, 1), 31.0),
        *block(11.2, (0.25, 400), (1000.0, 31), 5100.0),
        *block(11.4, (0.0, 1), (30.0, 1), 31.0),
    ]
)
CELL = {
    "nominal_tokens": 512,
    "concurrency": 1,
    "rows": [row("r1", 0.0, 5.3, 100.0, 28.0), row("r2", 6.0, 5.3, 100.0, 28.0)],
}


class TestParse:
    def test_every_complete_block_is_read_with_its_time(self) -> None:
        blocks = engine_timing.parse_blocks(LOG, TIMING)
        assert [(b.prompt_tokens, b.eval_tokens) for b in blocks] == [(400, 31), (1, 1), (400, 31), (1, 1)]
        assert abs(blocks[0].at - (T0 + 5.2)) < 1e-3
        assert blocks[0].prompt_tps == 100.0 and blocks[0].decode_tps == 31.0

    def test_untimestamped_lines_parse_too(self) -> None:
        plain = "\n".join(line.split(" ", 1)[1] for line in LOG.splitlines())
        assert len(engine_timing.parse_blocks(plain, TIMING)) == 4


class TestCompare:
    def test_each_row_gets_its_own_block_not_its_follow_up_or_a_neighbours(self) -> None:
        checks = engine_timing.match_rows(CELL["rows"], engine_timing.parse_blocks(LOG, TIMING))  # type: ignore[arg-type]
        assert [c.engine_prompt_tokens for c in checks] == [400, 400]
        assert checks[0].plausible_prompt_eval and not checks[1].plausible_prompt_eval

    def test_differences_are_reported_against_the_own_figures_and_the_totals(self) -> None:
        report = engine_timing.compare([CELL], engine_timing.parse_blocks(LOG, TIMING))
        (cell,) = report["cells"]
        assert cell["matched"] == 2 and report["unmatched_rows"] == 0
        assert cell["implausible_prompt_eval"] == 1
        # prefill from the totals: 400 tokens over (5100 - 1000) ms = 97.6 tok/s; gate 100
        assert abs(cell["prefill_diff_vs_totals"] - (100 - 400 / 4.1) / (400 / 4.1)) < 1e-3
        # decode: the engine's eval rate is 31/s, the gate measured 28/s
        assert abs(cell["decode_diff"] - (28 - 31) / 31) < 1e-3
        # the implausible prompt-eval line is left out of the engine's prompt-eval p50 (100/s)
        assert cell["engine_prompt_eval_tps_p50"] == 100.0 and cell["prefill_diff_vs_prompt_eval"] == 0.0
        assert engine_timing.worst(report, "prefill_diff_vs_totals") == abs(cell["prefill_diff_vs_totals"])

    def test_decode_is_judged_against_the_engines_own_window_eval_above_decode_phase_below(self) -> None:
        report = engine_timing.compare([CELL], engine_timing.parse_blocks(LOG, TIMING))
        (cell,) = report["cells"]  # type: ignore[misc]
        # r1's block: after prompt eval 5100 - 4000 = 1100 ms for 31 steps (28.2/s), of which
        # 1000 ms eval: 9 % of the decode phase is the server's per-token work. r2's block has an
        # implausible prompt-eval line and is left out of the decode phase.
        assert abs(cell["engine_decode_phase_tps_p50"] - 31 / 1.1) < 1e-6
        assert cell["engine_decode_overhead_p50"] == round(100 / 1100, 4)
        assert cell["decode_phase_from"] == "plausible blocks"
        # the gate's 28/s lies 9.7 % under the eval rate and 0.6 % under the decode phase: within
        assert cell["decode_within_engine"] is True
        assert abs(cell["decode_diff_vs_decode_phase"] - (28 - 31 / 1.1) / (31 / 1.1)) < 1e-3

    def test_a_decode_outside_the_window_is_not_within_either_side(self) -> None:
        blocks = engine_timing.parse_blocks(LOG, TIMING)
        for decode in (24.0, 35.0):  # under 28.2 * 0.9 = 25.4; over 31 * 1.1 = 34.1
            rows = [{**r, "decode_tps": decode} for r in CELL["rows"]]  # type: ignore[attr-defined]
            (cell,) = engine_timing.compare([{**CELL, "rows": rows}], blocks)["cells"]  # type: ignore[misc]
            assert cell["decode_within_engine"] is False, decode
        # Without tolerance the gate's 28/s is just under the decode phase's 28.2/s: outside.
        (cell,) = engine_timing.compare([CELL], blocks, tolerance=0.0)["cells"]  # type: ignore[misc]
        assert cell["decode_within_engine"] is False

    def test_decode_is_judged_request_by_request_over_the_same_requests(self) -> None:
        # r2's block has an implausible prompt-eval line: its decode phase is unknown, so r2 is
        # not judged, and its decode (far under r1's) does not move the p50s that are compared.
        rows = [CELL["rows"][0], {**CELL["rows"][1], "decode_tps": 10.0}]  # type: ignore[index,dict-item]
        blocks = engine_timing.parse_blocks(LOG, TIMING)
        (cell,) = engine_timing.compare([{**CELL, "rows": rows}], blocks)["cells"]  # type: ignore[misc]
        assert cell["decode_rows_judged"] == 1 and cell["gate_decode_tps_p50_judged"] == 28.0
        assert cell["decode_within_engine"] is True
        assert cell["decode_diff_vs_eval_paired"] == round((28 - 31) / 31, 4)

    def test_skipped_cells_and_incomplete_rows_are_left_out(self) -> None:
        cells = [
            {"nominal_tokens": 8192, "concurrency": 1, "skipped": "above max_model_len"},
            {**CELL, "rows": [{**CELL["rows"][0], "completed": False}]},  # type: ignore[index]
        ]
        report = engine_timing.compare(cells, engine_timing.parse_blocks(LOG, TIMING))
        assert [c["matched"] for c in report["cells"]] == [0]
