"""`recheck --slo`: the `[watch]` table, limits made absolute before any sample, breaches over
consecutive samples, and the official client's samples of a real stub process (healthy, then
each late fault that a watch must see)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from anvil_ctl.commands import audit, lifecycle, transactions
from anvil_ctl.commands.slo import Enablement, _roll_back
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.watch import qualified, standing_policy
from anvil_ctl.evidence.bundle import EvidenceWriter
from anvil_ctl.persistence import qualification
from anvil_ctl.qualify.profiles import load_profile, parse_profile
from anvil_ctl.qualify.slosample import RequestResult, Sample, open_client, sample
from anvil_ctl.qualify.watchpolicy import DEFAULT, Limit, Threshold, breaches, qualified_values
from scripts.campaign import verified_decision
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost
from tests.unit.test_stub_server import StubFactory, stub

__all__ = ["stub"]  # the fixture, shared with the stub's process tests

GATES = [{"type": "smoke"}]


def _watch(raw: object) -> object:
    return parse_profile({"gates": GATES, "watch": raw}, "p.toml").watch


class TestTheWatchTable:
    def test_a_profile_without_one_gets_the_default(self) -> None:
        assert parse_profile({"gates": GATES}, "p.toml").watch == DEFAULT

    def test_every_key_is_read(self) -> None:
        policy = _watch(
            {
                "duration": "5m",
                "interval_s": 0.5,
                "requests": 2,
                "max_tokens": 16,
                "consecutive": 4,
                "thresholds": [
                    {"metric": "ttft_p95_s", "max_ratio": 1.5},
                    {"metric": "error_rate", "max": 0},
                ],
            }
        )
        assert policy.duration_s == 300 and policy.interval_s == 0.5  # type: ignore[attr-defined]
        assert (policy.requests, policy.max_tokens, policy.consecutive) == (2, 16, 4)  # type: ignore[attr-defined]
        assert policy.thresholds == (  # type: ignore[attr-defined]
            Threshold("ttft_p95_s", "max_ratio", 1.5),
            Threshold("error_rate", "max", 0.0),
        )

    def test_duration_zero_means_a_cutover(self) -> None:
        assert _watch({"duration": "0"}).duration_s == 0  # type: ignore[attr-defined]

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            ({"thresholds": [{"metric": "latency", "max": 1}]}, "watch.thresholds[0].metric"),
            ({"thresholds": [{"metric": "error_rate", "max_ratio": 2}]}, "watch.thresholds[0].max_ratio"),
            ({"thresholds": [{"metric": "ttft_p95_s", "max": 1, "min": 0}]}, "watch.thresholds[0]"),
            ({"thresholds": [{"metric": "ttft_p95_s", "max": -1}]}, "watch.thresholds[0].max"),
            ({"consecutive": 0}, "watch.consecutive"),
            ({"interval_s": "soon"}, "watch.interval_s"),
            ({"duration": "forever"}, "watch.duration"),
            ({"sampling": 3}, "watch.sampling"),
            ({"thresholds": []}, "watch.thresholds"),
        ],
    )
    def test_a_wrong_value_names_its_field(self, raw: object, field: str) -> None:
        with pytest.raises(BadInput) as err:
            _watch(raw)
        assert err.value.data["field"] == field and "p.toml" in str(err.value)

    def test_relative_thresholds_become_absolute_against_the_qualified_values(self) -> None:
        limits = DEFAULT.limits({"ttft_p95_s": 0.2, "decode_tps_p50": 50.0})
        assert [(lim.metric, lim.op, lim.limit) for lim in limits] == [
            ("ttft_p95_s", "max", pytest.approx(0.25)),
            ("decode_tps_p50", "min", pytest.approx(40.0)),
            ("error_rate", "max", 0.01),
            ("finish_reason_missing", "max", 0.0),
            ("restarts", "max", 0.0),
            ("container_down", "max", 0.0),
            ("fatal_log_lines", "max", 0.0),
        ]

    def test_without_a_qualified_value_a_relative_threshold_is_reported_never_judged(self) -> None:
        (ttft, *_rest) = DEFAULT.limits({})
        assert ttft.limit is None and "no qualified ttft_p95_s" in ttft.source
        assert ttft.holds(9.0) is None

    def test_the_qualified_values_come_from_the_smallest_cell_at_concurrency_1(self) -> None:
        cells = [
            {"nominal_tokens": 16384, "concurrency": 1, "ttft_s_p95": 0.9, "decode_tps_p50": 30.0},
            {"nominal_tokens": 4096, "concurrency": 2, "ttft_s_p95": 0.5, "decode_tps_p50": 35.0},
            {"nominal_tokens": 4096, "concurrency": 1, "ttft_s_p95": 0.3, "decode_tps_p50": 40.0},
            {"nominal_tokens": 1024, "concurrency": 1, "skipped": "above max_model_len"},
        ]
        assert qualified_values(cells) == {"ttft_p95_s": 0.3, "decode_tps_p50": 40.0}

    def test_the_shipped_profiles_still_load(self) -> None:
        for name in ("smoke", "stub-smoke", "demo", "full", "seed-qualification"):
            assert load_profile(name).watch.consecutive >= 1


def _sample(ttft_s: float) -> dict[str, float | None]:
    return Sample(0.0, (RequestResult(True, ttft_s, 50.0, "stop", "m"),)).metrics()


class TestBreaches:
    LIMIT = Limit("ttft_p95_s", "max", 0.5, "max 0.5")

    def test_a_limit_failed_by_consecutive_samples_is_a_breach(self) -> None:
        samples = [_sample(ttft_s=0.9), _sample(ttft_s=0.8), _sample(ttft_s=0.7)]
        (found,) = breaches([self.LIMIT], samples, 3)
        assert found["metric"] == "ttft_p95_s" and found["observed"] == [0.9, 0.8, 0.7]

    def test_one_good_sample_between_breaks_the_run(self) -> None:
        samples = [_sample(ttft_s=0.9), _sample(ttft_s=0.1), _sample(ttft_s=0.9)]
        assert breaches([self.LIMIT], samples, 2) == []

    def test_a_limit_without_a_baseline_never_breaches(self) -> None:
        blind = Limit("ttft_p95_s", "max", None, "no qualified ttft_p95_s")
        assert breaches([blind], [_sample(ttft_s=9.0)] * 3, 1) == []


class TestOfficialClientSamples:
    """The sampler against a stub process standing in for the route (it speaks OpenAI)."""

    def _metrics(self, stub: StubFactory, *args: str) -> dict[str, float | None]:
        s = stub("--verbose-default", *args)
        client = open_client(s.url, "sk-not-checked")
        try:
            return sample(client, "stub", requests=3, max_tokens=8, clock=0.0).metrics()
        finally:
            client.close()

    def test_a_healthy_serve_has_no_errors_and_every_finish_reason(self, stub: StubFactory) -> None:
        m = self._metrics(stub)
        assert (m["error_rate"], m["finish_reason_missing"]) == (0.0, 0.0)
        assert m["ttft_p95_s"] is not None and m["decode_tps_p50"] is not None

    def test_500s_from_their_onset_are_errors(self, stub: StubFactory) -> None:
        m = self._metrics(stub, "--late-fault", "http-500@1")
        assert m["error_rate"] == pytest.approx(2 / 3)

    def test_a_truncated_stream_has_no_finish_reason(self, stub: StubFactory) -> None:
        m = self._metrics(stub, "--late-fault", "truncate-stream@0")
        assert (m["error_rate"], m["finish_reason_missing"]) == (0.0, 1.0)

    def test_slower_first_tokens_are_measured(self, stub: StubFactory) -> None:
        m = self._metrics(stub, "--late-fault", "slow-first-token:0.3@0")
        assert m["ttft_p50_s"] is not None and m["ttft_p50_s"] >= 0.3  # sleeps only overshoot


class TestFunctionalChecks:
    """A sample asked for them takes the functional gate's checks through the route with the
    gate's fixtures and checkers: counted as `functional_failed`."""

    def _sample(self, stub: StubFactory, *args: str, n: int = 0) -> Sample:
        s = stub(*args)
        client = open_client(s.url, "sk-not-checked")
        try:
            return sample(client, "stub", requests=1, max_tokens=8, clock=0.0, functional=n)
        finally:
            client.close()

    def test_a_healthy_serve_passes_both(self, stub: StubFactory) -> None:
        taken = self._sample(stub, n=3)
        assert [(c["check"], c["ok"]) for c in taken.functional] == [("tool_call", True), ("json", True)]
        assert taken.metrics()["functional_failed"] == 0

    @pytest.mark.parametrize(
        ("fault", "check", "classification"),
        [("bad-tool-args", "tool_call", "bad_tool_args"), ("bad-json", "json", "bad_json")],
    )
    def test_a_broken_answer_is_counted_as_the_gate_classifies_it(
        self, stub: StubFactory, fault: str, check: str, classification: str
    ) -> None:
        taken = self._sample(stub, "--fault", fault)
        (failed,) = [c for c in taken.functional if not c["ok"]]
        assert (failed["check"], failed["classification"]) == (check, classification)
        assert taken.metrics()["functional_failed"] == 1

    def test_not_asked_for_none_is_taken_and_the_metric_cannot_judge(self, stub: StubFactory) -> None:
        s = stub()
        client = open_client(s.url, "sk-not-checked")
        try:
            taken = sample(client, "stub", requests=1, max_tokens=8, clock=0.0)
        finally:
            client.close()
        assert taken.functional == () and taken.metrics()["functional_failed"] is None

    def test_a_threshold_may_name_it(self) -> None:
        policy = _watch({"thresholds": [{"metric": "functional_failed", "max": 0}]})
        assert policy.thresholds == (Threshold("functional_failed", "max", 0.0),)  # type: ignore[attr-defined]


class TestTheCommandLine:
    @pytest.fixture
    def run(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> Run:
        return in_process(fake_host, monkeypatch, capsys)

    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (["--rollback-on-breach"], "go with --slo"),
            (["--slo", "--rollback-on-breach", "--by", "alice", "--until", "2026-12-31"], "needs --by NAME"),
            (["--slo", "--by", "alice", "--until", "2026-12-31", "--reason", "r"], "needs --by NAME"),
            (
                ["--slo", "--rollback-on-breach", "--by", "alice", "--until", "soon", "--reason", "r"],
                "--until",
            ),
        ],
    )
    def test_a_wrong_combination_is_a_usage_error_and_records_nothing(
        self, run: Run, fake_host: FakeHost, args: list[str], says: str
    ) -> None:
        ran = run("recheck", "--slot", "primary", *args)
        assert ran.code == 2, ran.out + ran.err
        assert says in ran.err
        assert run("--json", "audit", "rechecks").json() == []

    def test_an_unknown_profile_is_bad_input_before_anything_is_observed(
        self, run: Run, tmp_path: Path
    ) -> None:
        ran = run("recheck", "--slot", "primary", "--slo", "--profile", str(tmp_path / "none.toml"))
        assert ran.code == 2, ran.out + ran.err
        assert run("--json", "audit", "rechecks").json() == []

    def test_without_a_router_the_slo_assertion_fails_and_says_why(self, fake_host: FakeHost) -> None:
        from anvil_ctl.commands import recheck

        cfg = fake_host.settings.config
        cfg.write_text(cfg.read_text().replace('kind = "smg"', 'kind = "none"'))
        result = recheck.recheck(fake_host.app(), "primary", slo=recheck.SloRequest())
        slo = next(a for a in result.assertions if a["name"] == "slo")
        assert result.exit_code == 6 and "router.kind is 'none'" in slo["observed"]["error"]


class TestRollbackOnBreach:
    BREACH: ClassVar[list[JSONObject]] = [
        {"metric": "ttft_p95_s", "op": "max", "limit": 1.0, "observed": [2.0, 2.1]}
    ]

    def test_past_its_until_nothing_is_rolled_back_and_the_run_says_so(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        ident = app.store.current_identity("primary", "incumbent")
        assert ident is not None
        enabled = Enablement("alice", datetime(2026, 1, 1, tzinfo=UTC), "bake")
        before = fake_host.world.read()
        out = _roll_back(app, ident, enabled, self.BREACH, datetime(2026, 6, 1, tzinfo=UTC))
        assert out == {"ran": False, "why": "--rollback-on-breach expired at 2026-01-01T00:00:00.000000Z"}
        assert fake_host.world.read() == before
        assert audit.transactions(app, kind="rollback") == []

    def test_in_force_it_rolls_back_attributed_to_the_policy_and_its_enabler(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        assert (
            transactions.load(app, slot="primary", candidate=fake_host.candidate("cand")).state
            == TxState.COMMITTED
        )
        verified_decision(app.store, "primary", "d-{digest}")
        promote = lifecycle.promote(app, slot="primary", approved_by="operator")
        assert promote.state == TxState.COMMITTED
        promoted = app.store.current_identity("primary", "incumbent")
        assert promoted is not None and promoted.container_id != fake_host.incumbent_id
        enabled = Enablement("alice", datetime(2099, 1, 1, tzinfo=UTC), "bake")
        out = _roll_back(app, promoted, enabled, self.BREACH, datetime(2026, 12, 4, tzinfo=UTC))
        assert isinstance(out, dict) and out["ran"] is True and out["state"] == "committed", out
        decided = audit.show(app, str(out["tx_id"]))["args"]["decided_by"]
        assert decided["enabled_by"] == "alice" and decided["policy"] == "rollback-on-breach"
        assert decided["breaches"] == self.BREACH and decided["serve"] == promoted.container_id
        assert decided["undoes"] == {"tx_id": promote.tx_id, "kind": "promote"}  # the link to the promote
        back = app.store.current_identity("primary", "incumbent")
        assert back is not None and back.container_id == fake_host.incumbent_id

    def test_an_enablement_needs_a_zoned_until_and_a_person(self) -> None:
        with pytest.raises(BadInput, match="--until"):
            Enablement("alice", datetime(2099, 1, 1), "bake")
        with pytest.raises(BadInput, match="--by"):
            Enablement("", datetime(2099, 1, 1, tzinfo=UTC), "bake")
        with pytest.raises(BadInput, match="--reason"):
            Enablement("alice", datetime(2099, 1, 1, tzinfo=UTC), "")


def _qualified_incumbent(host: FakeHost, profile: str, cells: list[JSONObject]) -> Path:
    """The incumbent's qualification as `qualify` leaves it: a transaction, its capacity
    artifact and evidence row, and a verified decision naming `profile`; the artifact's path."""
    app = host.app()
    ident = app.store.current_identity("primary", "incumbent")
    assert ident is not None
    tx = "tx-qualified"
    app.store.begin(kind="qualify", slot="primary", args={}, owner=app.owner, tx_id=tx)
    writer = EvidenceWriter(app.settings.evidence_dir, tx)
    art = writer.write_json(
        "03-capacity.json", {"name": "capacity", "passed": True, "evidence": {"cells": cells}}
    )
    writer.write_manifest()
    gate = {"name": "capacity", "kind": "functional", "passed": True, "classification": "pass"}
    path = writer.tx_dir / art.path
    qualification.record_evidence(
        app.store, tx, [{**gate, "artifact": str(path), "sha256": art.sha256, "size": art.size}]
    )
    qualification.record_decision(
        app.store,
        decision_id="dec-q",
        tx_id=tx,
        slot="primary",
        identity_digest=ident.qualification_digest,
        container_id=ident.container_id,
        outcome="verified",
        profile=profile,
    )
    return path


class TestThresholdsOfTheStandingServe:
    CELLS: ClassVar[list[JSONObject]] = [
        {"nominal_tokens": 4096, "concurrency": 1, "ttft_s_p95": 0.4, "decode_tps_p50": 60.0},
        {"nominal_tokens": 4096, "concurrency": 2, "ttft_s_p95": 0.9, "decode_tps_p50": 40.0},
    ]

    def test_the_profile_that_qualified_it_and_its_capacity_evidence_set_the_limits(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        profile = tmp_path / "bake.toml"
        profile.write_text(
            '[[gates]]\ntype = "smoke"\n[watch]\n'
            '[[watch.thresholds]]\nmetric = "ttft_p95_s"\nmax_ratio = 1.5\n'
            '[[watch.thresholds]]\nmetric = "decode_tps_p50"\nmin_ratio = 0.5\n'
        )
        _qualified_incumbent(fake_host, str(profile), self.CELLS)
        app = fake_host.app()
        ident = app.store.current_identity("primary", "incumbent")
        assert ident is not None
        policy, origin = standing_policy(app.store, ident, None)
        values, baseline = qualified(app.store, app.settings.evidence_dir, ident)
        assert origin == {"decision": "dec-q", "profile": str(profile)}
        assert values == {"ttft_p95_s": 0.4, "decode_tps_p50": 60.0} and baseline["gate"] == "capacity"
        limits = [(lim.metric, lim.op, lim.limit) for lim in policy.limits(values)]
        assert limits == [("ttft_p95_s", "max", pytest.approx(0.6)), ("decode_tps_p50", "min", 30.0)]

    def test_an_edited_artifact_gives_no_baseline(self, fake_host: FakeHost) -> None:
        path = _qualified_incumbent(fake_host, "smoke", self.CELLS)
        path.chmod(0o644)
        path.write_text(path.read_text().replace("60.0", "6000.0"))
        app = fake_host.app()
        ident = app.store.current_identity("primary", "incumbent")
        assert ident is not None
        values, baseline = qualified(app.store, app.settings.evidence_dir, ident)
        assert values == {} and "differs from its recorded SHA-256" in str(baseline["why"])
        (ttft, *_rest) = DEFAULT.limits(values)
        assert ttft.limit is None  # reported, never judged against an unverified number
