"""The stub's late faults (`--late-fault KIND[:VALUE]@N|Ts`): healthy until their onset, then
each does what a degrading engine does. The stub runs as a process (`test_stub_server`'s
factory); what each completion met is read back from its measured timings."""

from __future__ import annotations

import time

import httpx
import pytest

from anvil_ctl.qualify.logs import classify, patterns_for
from anvil_stub.options import parse_options
from anvil_stub.schedule import FATAL_LINE, LateFault, ScheduleError, effects, parse_late_fault
from tests.unit.test_stub_server import Stub, StubFactory, stub

__all__ = ["stub"]  # the fixture, shared with the stub's process tests

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _timings(s: Stub) -> list[dict[str, object]]:
    timings: list[dict[str, object]] = s.get("/anvil/sim/timings").json()["timings"]
    return timings


def _wait_exit(s: Stub, deadline_s: float = 10.0) -> int:
    return s.proc.wait(timeout=deadline_s)


class TestSpelling:
    @pytest.mark.parametrize(
        ("spec", "fault"),
        [
            ("http-500@3", LateFault("http-500", None, 3, None)),
            ("slow-first-token:1.5@2", LateFault("slow-first-token", 1.5, 2, None)),
            ("slow-decode:20@30s", LateFault("slow-decode", 20.0, None, 30.0)),
            ("exit@0.5s", LateFault("exit", None, None, 0.5)),
        ],
    )
    def test_a_spec_reads_as_its_fault(self, spec: str, fault: LateFault) -> None:
        assert parse_late_fault(spec) == fault

    @pytest.mark.parametrize(
        ("spec", "says"),
        [
            ("http-500", "expected KIND[:VALUE]@N"),
            ("melt@3", "unknown kind 'melt'"),
            ("slow-decode@3", "needs a positive VALUE in tokens/s"),
            ("slow-first-token:0@3", "needs a positive VALUE in seconds"),
            ("exit:2@3", "exit takes no VALUE"),
            ("http-500@2.5", "a count of completions is a whole number"),
        ],
    )
    def test_a_wrong_spec_is_named(self, spec: str, says: str) -> None:
        with pytest.raises(ScheduleError, match=f"late fault '{spec}'") as err:
            parse_late_fault(spec)
        assert says in str(err.value)

    def test_the_command_line_refuses_a_wrong_spec_with_exit_2(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            parse_options(["--late-fault", "melt@3"], {})
        assert exited.value.code == 2
        assert "unknown kind 'melt'" in capsys.readouterr().err

    def test_the_env_twin_takes_a_comma_separated_list(self) -> None:
        opts = parse_options([], {"ANVIL_STUB_LATE_FAULT": "http-500@3, exit@9s"})
        assert [f.kind for f in opts.late_faults] == ["http-500", "exit"]

    def test_effects_add_up_from_each_onset(self) -> None:
        faults = (parse_late_fault("slow-first-token:1@2"), parse_late_fault("slow-decode:5@10s"))
        assert effects(faults, 1, 0.0).kinds == ()
        assert effects(faults, 2, 0.0).extra_first_token_s == 1.0
        late = effects(faults, 2, 10.0)
        assert late.kinds == ("slow-decode", "slow-first-token") and late.decode_tps_cap == 5.0


class TestOnsetByCount:
    def test_http_500_begins_after_n_completions(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "http-500@2")
        codes = [s.post("/v1/chat/completions", CHAT).status_code for _ in range(4)]
        assert codes == [200, 200, 500, 500]
        err = s.post("/v1/chat/completions", CHAT).json()["error"]
        assert err["type"] == "server_error" and "http-500" in err["message"]

    def test_a_truncated_stream_has_no_finish_and_no_done(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "truncate-stream@1", "--verbose-default")
        whole, cut = s.sse({**CHAT, "stream": True}), s.sse({**CHAT, "stream": True})
        assert whole[-1] == "[DONE]" and '"finish_reason": "length"' in whole[-2].replace('":"', '": "')
        assert "[DONE]" not in cut and not any('"finish_reason": "' in c.replace('":"', '": "') for c in cut)
        assert 0 < len(cut) < len(whole)

    def test_slow_first_token_delays_only_the_completions_after_the_onset(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "slow-first-token:0.4@1", "--verbose-default")
        s.sse({**CHAT, "stream": True})
        s.sse({**CHAT, "stream": True})
        first, second = _timings(s)
        assert first["late_faults"] == [] and second["late_faults"] == ["slow-first-token"]
        assert float(second["prefill_s"]) >= 0.4  # type: ignore[arg-type]  # sleeps only overshoot

    def test_slow_decode_caps_the_rate_after_the_onset(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "slow-decode:20@1", "--verbose-default")
        s.sse({**CHAT, "stream": True})
        s.sse({**CHAT, "stream": True})
        first, second = _timings(s)
        assert first["late_faults"] == [] and second["late_faults"] == ["slow-decode"]
        # The last token at or after its due time (sleeps only overshoot): (tokens - 1) steps of 1/20 s.
        done = float(second["prefill_s"]) + float(second["decode_s"])  # type: ignore[arg-type]
        assert done >= (int(second["tokens"]) - 1) / 20  # type: ignore[call-overload]

    def test_fatal_log_prints_one_line_the_log_audit_calls_fatal(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "fatal-log@1")
        s.chat("one")
        s.chat("two")
        s.proc.terminate()
        _wait_exit(s)
        err = s.proc.stderr.read().decode() if s.proc.stderr else ""
        assert err.count(FATAL_LINE) == 1
        found = classify(err.splitlines(), patterns_for("stub"))
        assert [f["kind"] for f in found.fatal] == ["engine_error"], found

    def test_exit_ends_the_engine_with_1_after_its_nth_completion(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "exit@2")
        s.chat("one")
        s.chat("two")
        assert _wait_exit(s) == 1


class TestOnsetByTime:
    def test_http_500_begins_after_t_seconds(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "http-500@1s")
        deadline = time.monotonic() + 10
        codes = []
        while time.monotonic() < deadline:
            codes.append(s.post("/v1/chat/completions", CHAT).status_code)
            if codes[-1] == 500:
                break
            time.sleep(0.1)
        assert codes[-1] == 500 and set(codes[:-1]) <= {200}

    def test_exit_fires_without_a_request(self, stub: StubFactory) -> None:
        s = stub("--late-fault", "exit@0.5s")
        assert _wait_exit(s) == 1
        with pytest.raises(httpx.TransportError):
            s.get("/health")


def _onsets(s: Stub) -> dict[str, dict[str, object]]:
    return {o["kind"]: o for o in s.get("/anvil/sim/timings").json()["onsets"]}


class TestOnsetsReported:
    """`GET /anvil/sim/timings` names each late fault's wall-clock onset: when it is due (a time
    onset, known from the start) and when it first acted, the faults without a timing included."""

    def test_a_count_onset_is_reported_when_the_first_changed_completion_began(
        self, stub: StubFactory
    ) -> None:
        s = stub("--late-fault", "http-500@1", "--late-fault", "truncate-stream@5")
        s.chat("one")
        assert _onsets(s)["http-500"]["began_at"] is None
        before = time.time()
        assert s.post("/v1/chat/completions", CHAT).status_code == 500
        onsets = _onsets(s)
        began = onsets["http-500"]["began_at"]
        assert isinstance(began, float) and before <= began <= time.time()
        assert (onsets["http-500"]["due_at"], onsets["http-500"]["after_completions"]) == (None, 1)
        assert onsets["truncate-stream"]["began_at"] is None  # not reached yet

    def test_a_time_onset_is_known_before_it_acts_and_fatal_log_when_it_fired(
        self, stub: StubFactory
    ) -> None:
        s = stub("--late-fault", "fatal-log@1s", "--late-fault", "exit@600s")
        found = s.get("/anvil/sim/timings").json()
        onsets = {o["kind"]: o for o in found["onsets"]}
        assert onsets["exit"]["due_at"] == pytest.approx(found["started_at"] + 600, abs=0.01)
        assert onsets["exit"]["began_at"] is None
        deadline = time.monotonic() + 10
        while _onsets(s)["fatal-log"]["began_at"] is None:
            assert time.monotonic() < deadline, _onsets(s)
            time.sleep(0.1)
        fatal = _onsets(s)["fatal-log"]
        assert float(fatal["began_at"]) >= float(fatal["due_at"])  # type: ignore[arg-type]
