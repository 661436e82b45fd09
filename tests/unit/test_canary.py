"""`promote --canary`: the shares, the side-by-side verdict, the fit of two serves, and the plan
on the fake host: refused before anything changes where the router cannot weigh or no
incumbent serves beside the candidate; a breach sends every request back to the incumbent and
stops the candidate; a healthy canary ends as a promote does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from anvil_ctl.commands import lifecycle, recheck, transactions
from anvil_ctl.core.errors import AdapterError, BadInput
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE, LABEL_SLOT, ContainerSpec, Readmission
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.engine import entry
from anvil_ctl.engine.plans.args import CanaryRequest, Candidate, RollbackRequest
from anvil_ctl.engine.plans.canary import ServesFitTogether
from anvil_ctl.engine.recover import recover_unfinished
from anvil_ctl.engine.runner import Faults
from anvil_ctl.engine.watch import watch
from anvil_ctl.qualify import canary
from anvil_ctl.qualify.canary import SideBySide, judge, parse_shares
from anvil_ctl.qualify.slosample import RequestResult, Sample
from anvil_ctl.qualify.watchpolicy import Threshold, WatchPolicy
from anvil_ctl.testing.router import FakeRouter
from tests.unit.fakehost import HOST_TOML, FakeHost, make_fake_host

POLICY = WatchPolicy(
    interval_s=1.0,
    requests=2,
    consecutive=2,
    thresholds=(Threshold("ttft_p95_s", "max_ratio", 1.5), Threshold("error_rate", "max", 0.0)),
)


def sample(ttft: float | None, *, failed: int = 0, at: float = 0.0) -> Sample:
    ok = [RequestResult(True, ttft, 50.0, "stop", "m")] * (2 - failed)
    return Sample(at, (*ok, *[RequestResult(False, error="HTTP 500")] * failed))


class TestShares:
    def test_rising_percentages_ending_at_100_are_the_steps(self) -> None:
        assert parse_shares("10, 50,100") == (10, 50, 100)
        assert parse_shares("100") == (100,)

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("10,50", "the last step must be 100"),
            ("50,10,100", "must rise"),
            ("10,10,100", "must rise"),
            ("0,100", "from 1 to 100"),
            ("10,150", "from 1 to 100"),
            ("ten,100", "whole percentages"),
            ("", "whole percentages"),
        ],
    )
    def test_anything_else_is_bad_input_naming_the_option(self, text: str, problem: str) -> None:
        with pytest.raises(BadInput, match=problem) as err:
            parse_shares(text)
        assert err.value.data["field"] == "canary"


def Round(incumbent: Sample, candidate: Sample, first: str) -> dict[str, Any]:
    """A side-by-side round as `SideBySide` takes it and the step journals it."""
    return {"first": first, "incumbent": incumbent.as_dict(), "candidate": candidate.as_dict()}


class TestSideBySideVerdict:
    def test_a_relative_limit_is_the_incumbents_value_in_the_same_round(self) -> None:
        slow_host = [Round(sample(2.0), sample(2.9), "incumbent")] * 3  # 1.45 x: within 1.5 x
        assert judge(POLICY, slow_host) == []
        worse = [Round(sample(1.0), sample(1.6), "incumbent")] * 2  # 1.6 x
        [breach] = judge(POLICY, worse)
        assert (breach["metric"], breach["op"]) == ("ttft_p95_s", "max")
        assert [r["limit"] for r in breach["rounds"]] == [1.5, 1.5]  # type: ignore[index]
        assert [r["incumbent"] for r in breach["rounds"]] == [1.0, 1.0]  # type: ignore[index]

    def test_a_breach_needs_consecutive_failing_rounds(self) -> None:
        rounds = [
            Round(sample(1.0), sample(1.0, failed=1), "incumbent"),
            Round(sample(1.0), sample(1.0), "candidate"),
            Round(sample(1.0), sample(1.0, failed=1), "incumbent"),
        ]
        assert judge(POLICY, rounds) == []
        rounds.append(Round(sample(1.0), sample(1.0, failed=2), "candidate"))
        [breach] = judge(POLICY, rounds)
        assert breach["metric"] == "error_rate"
        assert [r["candidate"] for r in breach["rounds"]] == [0.5, 1.0]  # type: ignore[index]

    def test_a_round_the_incumbent_cannot_judge_breaks_the_run(self) -> None:
        ttft_only = dataclasses.replace(POLICY, thresholds=POLICY.thresholds[:1])
        rounds = [
            Round(sample(1.0), sample(5.0), "incumbent"),
            Round(sample(None, failed=2), sample(5.0), "candidate"),  # no incumbent TTFT to compare
            Round(sample(1.0), sample(5.0), "incumbent"),
        ]
        assert judge(ttft_only, rounds) == []
        rounds.append(Round(sample(1.0), sample(5.0), "candidate"))
        assert [b["metric"] for b in judge(ttft_only, rounds)] == ["ttft_p95_s"]


@dataclass
class Clock:
    t: float = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class TestWatchingAStep:
    """A step is `engine.watch.watch` over side-by-side rounds, judged by `judge`."""

    def _step(
        self, monkeypatch: pytest.MonkeyPatch, duration_s: float, bad: bool = False
    ) -> tuple[Any, list[Any], list[str]]:
        clock, calls, rounds = Clock(), [], []

        def fake_sample(_c: Any, model: str, *, requests: int, max_tokens: int, clock: float) -> Sample:
            calls.append(model)
            return sample(1.0, failed=2 if bad and model == "cand" else 0, at=clock)

        monkeypatch.setattr(canary, "sample", fake_sample)
        verdict = watch(
            duration_s=duration_s,
            interval_s=POLICY.interval_s,
            consecutive=POLICY.consecutive,
            judge=lambda kept: judge(POLICY, kept),
            take=SideBySide(
                {"incumbent": None, "candidate": None}, {"incumbent": "inc", "candidate": "cand"}, POLICY
            ),  # type: ignore[dict-item]
            record=rounds.append,
            stop=lambda: None,
            at_least=POLICY.consecutive,
            clock=clock.now,
            sleep=clock.sleep,
        )
        return verdict, rounds, calls

    def test_a_healthy_step_samples_both_in_alternating_order_for_its_duration(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        verdict, rounds, calls = self._step(monkeypatch, 3.0)
        assert verdict.healthy and len(rounds) == 3
        assert calls[:4] == ["inc", "cand", "cand", "inc"]
        assert [r["first"] for r in rounds] == ["incumbent", "candidate", "incumbent"]

    def test_a_short_step_still_takes_enough_rounds_to_see_a_breach(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        verdict, rounds, _ = self._step(monkeypatch, 0.1)
        assert verdict.healthy and len(rounds) == POLICY.consecutive

    def test_the_first_breach_ends_the_step(self, monkeypatch: pytest.MonkeyPatch) -> None:
        verdict, rounds, _ = self._step(monkeypatch, 60.0, bad=True)
        assert len(rounds) == 2 and [b["metric"] for b in verdict.breaches] == ["error_rate"]
        assert verdict.breaches[0]["rounds"][0]["incumbent"] == 0.0


def _fit_ctx(
    inc_roles: tuple[str, ...], cand_roles: tuple[str, ...], needs: tuple[int | None, int | None]
) -> Any:
    gpu = SimpleNamespace(capacity_mib=97887)
    config = SimpleNamespace(gpu_roles={"compute-a": gpu, "compute-b": gpu})
    args = SimpleNamespace(
        incumbent=SimpleNamespace(gpu_roles=inc_roles),
        candidate=SimpleNamespace(gpu_roles=cand_roles, recipe_digest="d" * 64),
        vram_need_mib=needs,
    )
    return SimpleNamespace(args=args, world=SimpleNamespace(config=config))


@pytest.fixture(autouse=False)
def standing_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reserve in force: 3,072 MiB on every role, no waiver."""
    monkeypatch.setattr(
        "anvil_ctl.engine.plans.canary.reserve_in_force", lambda _w, roles, _d: ({r: 3072 for r in roles}, [])
    )


@pytest.mark.usefixtures("standing_reserve")
class TestTwoServesFit:
    @pytest.mark.parametrize(
        ("inc", "cand", "needs"),
        [
            ((), (), (None, None)),  # CPU engines
            (("compute-a",), ("compute-b",), (90000, 90000)),  # split roles
            (("compute-a",), (), (90000, None)),
            (("compute-a",), ("compute-a",), (40000, 50000)),  # 93,072 <= 97,887
        ],
    )
    def test_these_fit(self, inc: tuple[str, ...], cand: tuple[str, ...], needs: Any) -> None:
        assert ServesFitTogether().check(_fit_ctx(inc, cand, needs)) is None

    def test_two_needs_and_the_reserve_above_a_shared_cards_capacity_do_not(self) -> None:
        refusal = ServesFitTogether().check(
            _fit_ctx(("compute-a",), ("compute-a", "compute-b"), (60000, 40000))
        )
        assert refusal is not None
        assert "60000 + 40000 MiB + reserve 3072 MiB = 103072 MiB > capacity 97887 MiB" in refusal.reason

    def test_a_shared_card_with_an_unknown_need_is_not_proven_to_fit(self) -> None:
        refusal = ServesFitTogether().check(_fit_ctx(("compute-a",), ("compute-a",), (None, 40000)))
        assert refusal is not None and "the incumbent is not known" in refusal.reason


# -- the plan on the fake host ----------------------------------------------------------------

SECOND_SLOT = """
[slots.primary-b]
binding = "127.0.0.1:8002"
router_tier = "primary-local"
aliases = ["llm.primary"]
"""


class WeighingRouter(FakeRouter):
    """The fake router with a second backend per tier and weights, as HAProxy's servers have:
    the tier's own URL is the routed one; `beside` holds a backend registered next to it."""

    def __init__(self, world: Any) -> None:
        super().__init__(world)
        self.beside: dict[str, str] = {}
        self.weights: dict[str, int] = {}
        self.history: list[dict[str, int]] = []

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        current = self._tier(self.world.read(), tier)
        if current["url"] not in (None, url) and current["state"] == "ready":
            self.beside[tier] = url
            return
        super().register(tier, url, aliases)

    def deregister(self, tier: str, url: str) -> None:
        if self.beside.get(tier) == url:
            del self.beside[tier]
            return
        super().deregister(tier, url)

    def readmit(self, r: Readmission) -> None:
        """The tier's one backend from now on, as HAProxy's readmission leaves it."""
        self.beside.pop(r.tier, None)
        FakeRouter.register(self, r.tier, r.url, r.aliases)
        super().readmit(r)

    def set_weights(self, tier: str, weights: dict[str, int]) -> None:
        self.weights.update(weights)
        self.history.append(dict(weights))


def _cpu_candidate(host: FakeHost, served: str) -> Candidate:
    spec = ContainerSpec(
        name="canary-cand",
        image=host.image_id,
        env=(("FAKE_SERVED_MODEL", served), ("FAKE_BINDING", "127.0.0.1:8002")),
        labels=((LABEL_MANAGED, "true"), (LABEL_SLOT, "primary-b"), (LABEL_ROLE, "candidate")),
    )
    return Candidate(
        recipe="cand",
        recipe_digest="d" * 64,
        served_model=served,
        context_tokens=393216,
        health_path="/health",
        startup_timeout_s=0.5,
        spec=spec,
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[FakeHost]:
    """The fake host with a second slot of the primary tier and a verified candidate loaded there."""
    host = make_fake_host(tmp_path)
    host.settings.config.write_text(HOST_TOML + SECOND_SLOT)
    out = transactions.load(host.app(), slot="primary-b", candidate=_cpu_candidate(host, "cand-b"))
    assert out.state == TxState.COMMITTED, out.reason
    host.decide(slot="primary-b")
    yield host


def _request(**kw: Any) -> CanaryRequest:
    return CanaryRequest(
        **{"slot": "primary-b", "approved_by": "ops", "shares": (10, 50, 100), "step_watch_s": 0.01, **kw}
    )


def _tiers(host: FakeHost) -> Any:
    return host.world.read()["router"]["tiers"]


class TestRefusedBeforeAnythingChanges:
    def test_smg_cannot_weigh_so_the_canary_is_refused_naming_it(self, pair: FakeHost) -> None:
        before = (_tiers(pair), [c.id for c in pair.app().world().runtime.list() if c.running])
        out = lifecycle.canary(
            pair.app(), slot="primary-b", approved_by="ops", shares="10,50,100", step_watch_s=1.0
        )
        assert (out.state, out.exit_code) == (TxState.REFUSED, ExitCode.REFUSED)
        assert "router smg cannot split a tier's traffic by weight" in (out.reason or "")
        after = (_tiers(pair), [c.id for c in pair.app().world().runtime.list() if c.running])
        assert after == before

    def test_without_an_incumbent_serving_the_tier_from_another_slot_it_is_bad_input(
        self, pair: FakeHost
    ) -> None:
        pair.app().world().runtime.stop(pair.incumbent_id, 1)
        with pytest.raises(BadInput, match="no other slot of router tier primary-local") as err:
            lifecycle.canary(pair.app(), slot="primary-b", approved_by="ops", shares="100", step_watch_s=1.0)
        assert err.value.data["field"] == "canary"


@pytest.fixture
def weighing(
    pair: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FakeHost, Any, WeighingRouter]]:
    world = pair.app().world()
    router = WeighingRouter(pair.world)
    world.router = router
    yield pair, world, router


def _arms(monkeypatch: pytest.MonkeyPatch, bad_from_share: int | None, router: WeighingRouter) -> None:
    """Sampling without HTTP: the candidate fails every request once its share reaches
    `bad_from_share` (None: never)."""

    def fake_sample(client: Any, model: str, *, requests: int, max_tokens: int, clock: float) -> Sample:
        share = router.history[-1].get("http://127.0.0.1:8002", 0) if router.history else 0
        bad = model == "cand-b" and bad_from_share is not None and share >= bad_from_share
        return sample(1.0, failed=2 if bad else 0, at=clock)

    monkeypatch.setattr(canary, "sample", fake_sample)


PROFILE = """
name = "canary-watch"
[[gates]]
type = "smoke"
[watch]
interval_s = 0.01
requests = 2
consecutive = 2
[[watch.thresholds]]
metric = "error_rate"
max = 0
"""


class TestTheCanaryOnAWeighingRouter:
    def _run(self, host: FakeHost, world: Any) -> Any:
        profile = host.root / "canary-watch.toml"
        profile.write_text(PROFILE)
        request = dataclasses.replace(_request(), profile=str(profile), vram_need_mib=(0, 0))
        return entry.run(world, host.app().owner, request)

    def test_a_breach_at_the_second_step_sends_everything_back_and_stops_the_candidate(
        self, weighing: tuple[FakeHost, Any, WeighingRouter], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        host, world, router = weighing
        _arms(monkeypatch, 50, router)
        out = self._run(host, world)
        assert out.state == TxState.COMPENSATED, out.reason
        assert "canary breach at 50 %" in (out.reason or "")
        assert router.history[-1] == {"http://127.0.0.1:8001": 100, "http://127.0.0.1:8002": 0}
        assert [h.get("http://127.0.0.1:8002") for h in router.history[1:4]] == [0, 10, 50]
        assert router.beside == {} and _tiers(host)["primary-local"]["url"] == "http://127.0.0.1:8001"
        cand = host.app().store.current_identity("primary-b", "candidate")
        assert cand is not None and not world.runtime.inspect(cand.container_id).running  # retained
        inc = host.app().store.current_identity("primary", "incumbent")
        assert inc is not None and inc.container_id == host.incumbent_id
        assert world.runtime.inspect(host.incumbent_id).running
        # The candidate stopped by the undo: its slot stands by, the incumbent's serves.
        for slot, phase in (("primary", "serving"), ("primary-b", "standby")):
            r = recheck.recheck(host.app(), slot)
            assert (r.phase, r.exit_code, r.failed) == (phase, 0, []), r.assertions

    def test_a_healthy_canary_ends_as_a_promote_does(
        self, weighing: tuple[FakeHost, Any, WeighingRouter], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        host, world, router = weighing
        _arms(monkeypatch, None, router)
        out = self._run(host, world)
        assert out.state == TxState.COMMITTED, out.reason
        assert [h.get("http://127.0.0.1:8002") for h in router.history[1:]] == [0, 10, 50, 100]
        assert _tiers(host)["primary-local"]["url"] == "http://127.0.0.1:8002"
        store = host.app().store
        cand = store.current_identity("primary-b", "incumbent")
        rollback = store.current_identity("primary", "rollback")
        assert cand is not None and cand.served_model == "cand-b"
        assert rollback is not None and rollback.container_id == host.incumbent_id
        assert not world.runtime.inspect(host.incumbent_id).running  # stopped, retained
        assert out.results["share-100"]["verdict"] == "healthy"

    def test_after_it_a_rollback_of_the_old_incumbents_slot_brings_it_back_and_stops_the_candidate(
        self, weighing: tuple[FakeHost, Any, WeighingRouter], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        host, world, router = weighing
        _arms(monkeypatch, None, router)
        assert self._run(host, world).state == TxState.COMMITTED
        cand = host.app().store.current_identity("primary-b", "incumbent")
        assert cand is not None
        back = entry.run(world, host.app().owner, RollbackRequest(slot="primary"))
        assert back.state == TxState.COMMITTED, back.reason
        assert back.results["stop-current"]["container_id"] == cand.container_id
        assert _tiers(host)["primary-local"]["url"] == "http://127.0.0.1:8001"
        assert world.runtime.inspect(host.incumbent_id).running
        assert not world.runtime.inspect(cand.container_id).running  # stopped, retained

    def test_after_it_the_record_reads_as_one_serve_of_the_tier(
        self, weighing: tuple[FakeHost, Any, WeighingRouter], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The serving slot rechecks `serving`, the old incumbent's `standby`, both exit 0; a
        rollback by the serving slot's name goes back to the incumbent the canary replaced, and
        then the two slots swap phases."""
        host, world, router = weighing
        _arms(monkeypatch, None, router)
        out = self._run(host, world)
        assert out.state == TxState.COMMITTED, out.reason
        assert out.results["acceptance"] and out.results["vram-after-acceptance"]["passed"]
        assert out.results["record-promotion"]["vram_after_acceptance"]["passed"]
        cand = host.app().store.current_identity("primary-b", "incumbent")
        assert cand is not None

        def phases() -> dict[str, tuple[str, int, list[str]]]:
            return {
                slot: (r.phase, r.exit_code, r.failed)
                for slot in ("primary", "primary-b")
                for r in [recheck.recheck(host.app(), slot)]
            }

        assert phases() == {"primary-b": ("serving", 0, []), "primary": ("standby", 0, [])}
        standby = recheck.recheck(host.app(), "primary").assertions[0]["observed"]
        assert (standby["served_by"], standby["retained"]) == ("primary-b", host.incumbent_id)

        back = entry.run(world, host.app().owner, RollbackRequest(slot="primary-b"))
        assert back.state == TxState.COMMITTED, back.reason
        assert back.results["stop-current"]["container_id"] == cand.container_id
        assert _tiers(host)["primary-local"]["url"] == "http://127.0.0.1:8001"
        assert world.runtime.inspect(host.incumbent_id).running
        assert phases() == {"primary": ("serving", 0, []), "primary-b": ("standby", 0, [])}

    def test_a_slot_with_no_way_back_names_the_slot_that_serves_its_tier(
        self, weighing: tuple[FakeHost, Any, WeighingRouter], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        host, world, _router = weighing
        refused = entry.run(world, host.app().owner, RollbackRequest(slot="primary-b"))
        assert refused.state == TxState.REFUSED, refused.reason
        assert (
            "slot primary-b: no rollback identity is recorded; its tier is served by slot primary: "
            "rollback --slot primary"
        ) in (refused.reason or "")


class StrictWeighingRouter(WeighingRouter):
    """As HAProxy's `set server B/S weight`: a server that is not in the tier is refused."""

    def set_weights(self, tier: str, weights: dict[str, int]) -> None:
        known = {self._tier(self.world.read(), tier)["url"], self.beside.get(tier)}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise AdapterError(f"haproxy: no server for {unknown} in tier {tier}")
        super().set_weights(tier, weights)


class Killed(BaseException):
    """The process dying at a journal boundary, in-process (a real kill would end the test)."""


@dataclass(frozen=True)
class KilledAt(Faults):
    def at(self, boundary: str) -> None:
        if boundary == self.crash_at:
            raise Killed(boundary)


class TestRecoveredAfterAKill:
    def test_killed_before_the_candidate_was_admitted_the_undo_weighs_the_incumbent_alone(
        self, pair: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Killed as `declare`'s result and `admit-candidate`'s intent commit: the candidate has
        no server in the tier yet, so the undo cannot weigh it; it sets the incumbent's weight
        alone, stops and retains the candidate, and the transaction ends compensated."""
        world = pair.app().world()
        router = world.router = StrictWeighingRouter(pair.world)
        _arms(monkeypatch, None, router)
        profile = pair.root / "canary-watch.toml"
        profile.write_text(PROFILE)
        request = dataclasses.replace(_request(), profile=str(profile), vram_need_mib=(0, 0))
        with pytest.raises(Killed):
            entry.run(world, pair.app().owner, request, faults=KilledAt(crash_at="canary:declare:do:result"))
        (rec,) = pair.app().store.unfinished()
        steps = [(e.step, e.event) for e in pair.app().store.step_events(rec.id) if e.phase == "do"]
        assert steps[-1] == ("admit-candidate", "intent"), steps  # its do never ran
        report = recover_unfinished(pair.app().owner, world)
        (done,) = report.recovered
        assert (done["state"], done["undone"]) == ("compensated", ["admit-candidate"]), done
        assert router.history == [{"http://127.0.0.1:8001": 100}]
        assert _tiers(pair)["primary-local"]["url"] == "http://127.0.0.1:8001"
        cand = pair.app().store.current_identity("primary-b", "candidate")
        assert cand is not None and not world.runtime.inspect(cand.container_id).running  # retained
        assert world.runtime.inspect(pair.incumbent_id).running


def test_while_a_candidate_qualifies_beside_the_incumbent_both_slots_recheck_clean(pair: FakeHost) -> None:
    """The other slot's recorded candidate is its own campaign, not a stray on the host."""
    for slot, phase in (("primary", "serving"), ("primary-b", "qualifying")):
        r = recheck.recheck(pair.app(), slot)
        assert (r.phase, r.exit_code, r.failed) == (phase, 0, []), r.assertions
