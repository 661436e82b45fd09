"""Capacity arithmetic and the coding classifier, as pure functions."""

from __future__ import annotations

import pytest

from anvil_ctl.qualify.gates.coding import TASKS, classify
from anvil_ctl.qualify.results import ChatResult, Usage, percentile, request_metrics


class TestPercentile:
    def test_interpolates_between_ranks(self) -> None:
        assert percentile([1.0, 2.0, 3.0], 50) == 2.0
        assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
        assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
        assert percentile([], 50) is None
        assert percentile([7.0], 95) == 7.0


class TestRequestMetrics:
    def test_prefill_and_decode_follow_the_seed_definitions(self) -> None:
        result = ChatResult(
            status=200,
            content="x",
            reasoning="",
            tool_calls=(),
            finish_reason="length",
            usage=Usage(prompt_tokens=4000, completion_tokens=101, total_tokens=4101),
            model="m",
            streamed=True,
            e2e_s=2.5,
            ttft_s=0.6,
            ttfo_s=0.5,
        )
        m = request_metrics(result)
        assert m["prefill_tps"] == pytest.approx(8000.0)
        assert m["decode_tps"] == pytest.approx(100 / 2.0)
        assert m["ttft_s"] == 0.6

    def test_without_usage_or_first_output_the_rates_are_unknown(self) -> None:
        result = ChatResult(200, "", "", (), None, None, "m", True, 1.0)
        m = request_metrics(result)
        assert m["prefill_tps"] is None and m["decode_tps"] is None


class TestCodingClassify:
    def test_every_reference_answer_passes(self) -> None:
        for task in TASKS:
            assert classify(task, task.reference, "stop") == ("pass", [])

    def test_a_cut_answer_without_anything_wrong_is_budget_exhausted(self) -> None:
        task = TASKS[2]
        verdict, _ = classify(task, task.reference[:10], "length")
        assert verdict == "visible_answer_budget_exhausted"

    def test_a_cut_answer_that_is_already_wrong_is_wrong(self) -> None:
        task = next(t for t in TASKS if t.id == "move-plan")
        assert classify(task, "```sh\nrm -rf /srv/in", "length")[0] == "wrong_answer"

    def test_a_complete_wrong_answer_is_wrong_with_its_problems(self) -> None:
        task = next(t for t in TASKS if t.id == "fix-mean")
        verdict, problems = classify(
            task, "```python\ndef mean(xs):\n    return sum(xs) / len(xs) - 1\n```", "stop"
        )
        assert verdict == "wrong_answer" and problems

    def test_a_regex_that_accepts_bad_dates_is_wrong(self) -> None:
        task = next(t for t in TASKS if t.id == "iso-date-regex")
        verdict, problems = classify(task, "```\n\\d{4}-\\d{2}-\\d{2}\n```", "stop")
        assert verdict == "wrong_answer"
        assert any("2026-13-01" in p for p in problems)
