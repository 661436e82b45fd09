"""The stub's measured timing (`GET /anvil/sim/timings`): the ground truth benchmarks judge by."""

from __future__ import annotations

import time

from tests.unit.test_stub_server import Stub, StubFactory, stub

__all__ = ["stub"]  # the fixture, shared with the stub's process tests


def stream(s: Stub, text: str, max_tokens: int) -> list[str]:
    return s.sse(
        {
            "messages": [{"role": "user", "content": text}],
            "stream": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
        }
    )


class TestMeasuredTimings:
    def test_a_fresh_stub_has_measured_nothing(self, stub: StubFactory) -> None:
        found = stub().get("/anvil/sim/timings").json()
        assert (found["timings"], found["onsets"]) == ([], [])
        assert abs(found["started_at"] - time.time()) < 60

    def test_each_streamed_completion_reports_what_it_really_took(self, stub: StubFactory) -> None:
        s = stub("--prefill-tps", "400", "--decode-tps", "50", "--verbose-default")
        stream(s, "x" * 400, 6)
        stream(s, "y" * 800, 4)
        first, second = s.get("/anvil/sim/timings").json()["timings"]
        assert [first["seq"], second["seq"]] == [1, 2]
        assert first["tokens"] == 6 and second["tokens"] == 4
        # Never sooner than the configured schedule (sleeps only overshoot it): the first token
        # at or after its due time, the last one at or after its own.
        for t, tokens in ((first, 6), (second, 4)):
            assert t["prefill_s"] >= t["prompt_tokens"] / 400
            assert t["prefill_s"] + t["decode_s"] >= t["prompt_tokens"] / 400 + (tokens - 1) / 50
        assert second["prompt_tokens"] > first["prompt_tokens"]

    def test_an_instant_stub_reports_near_zero_durations(self, stub: StubFactory) -> None:
        s = stub("--verbose-default")
        stream(s, "hello", 3)
        (timing,) = s.get("/anvil/sim/timings").json()["timings"]
        assert timing["tokens"] == 3
        assert 0 <= timing["prefill_s"] < 1 and 0 <= timing["decode_s"] < 1
