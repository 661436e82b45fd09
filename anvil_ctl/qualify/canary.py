"""A canary's arithmetic and its verdict: the traffic shares it steps through, and the side-by-side
judgement of the candidate against the incumbent on the same samples.

At each step both serves get the same few streamed chats (`slosample`), each at its own
binding, the order alternating per round as in the A/B control (`qualify.ab`), so that load
on the host falls on both alike. The profile's `[watch]` thresholds hold the candidate: an
absolute limit as written, a relative one (`max_ratio`, `min_ratio`) against the incumbent's
value in the same round, so "ttft_p95_s max_ratio 1.25" reads "at most 1.25 x the incumbent's,
on the same prompts, at the same moment". A threshold failed in `consecutive` rounds in a row
is a breach; a round that cannot judge a threshold (the incumbent failed too) breaks its run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import TypeAdapter

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONMapping, JSONObject
from anvil_ctl.qualify.slosample import Sample
from anvil_ctl.qualify.watchpolicy import WatchPolicy

MAX_STEPS = 20


def parse_shares(text: str) -> tuple[int, ...]:
    """`--canary 10,50,100`: the candidate's share of new requests, in %, per step; rising,
    each 1-100, the last 100 (a canary ends by carrying everything, or it is not a promotion)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise BadInput(f"--canary {text!r}: expected whole percentages like 10,50,100", field="canary")
    shares = tuple(int(p) for p in parts)
    problem = ""
    if not 1 <= len(shares) <= MAX_STEPS:
        problem = f"expected 1 to {MAX_STEPS} steps"
    elif any(not 1 <= s <= 100 for s in shares):
        problem = "each share is a percentage from 1 to 100"
    elif any(b <= a for a, b in itertools.pairwise(shares)):
        problem = "the shares must rise step by step"
    elif shares[-1] != 100:
        problem = "the last step must be 100"
    if problem:
        raise BadInput(f"--canary {text!r}: {problem}", field="canary")
    return shares


_POLICY: TypeAdapter[WatchPolicy] = TypeAdapter(WatchPolicy)


def policy_to_json(policy: WatchPolicy) -> JSONObject:
    """A watch policy as a canary's arguments journal it."""
    data: JSONObject = _POLICY.dump_python(policy, mode="json")
    return data


def policy_from_json(data: JSONMapping) -> WatchPolicy:
    """The watch policy a canary's arguments journaled."""
    return _POLICY.validate_python(data)


@dataclass(frozen=True)
class Round:
    """One side-by-side round: both serves' samples of the same prompts, and who went first."""

    incumbent: Sample
    candidate: Sample
    first: str

    def as_dict(self) -> JSONObject:
        return {
            "first": self.first,
            "incumbent": self.incumbent.as_dict(),
            "candidate": self.candidate.as_dict(),
        }


def summary(rounds: Sequence[Round]) -> str:
    """One line for `audit show`: each serve's worst TTFT p95 and error rate over the rounds."""

    def worst(arm: str, metric: str) -> float | None:
        values = [getattr(r, arm).metrics()[metric] for r in rounds]
        known = [v for v in values if v is not None]
        return max(known) if known else None

    def arm(name: str) -> str:
        ttft, errors = worst(name, "ttft_p95_s"), worst(name, "error_rate")
        shown = "-" if ttft is None else f"{ttft:.3f} s"
        return f"{name} ttft_p95 <= {shown}, error_rate <= {errors or 0:.0%}"

    return f"{len(rounds)} round(s): {arm('candidate')}; {arm('incumbent')}"


def judge(policy: WatchPolicy, rounds: Sequence[Round]) -> list[JSONObject]:
    """The thresholds the candidate failed in `policy.consecutive` rounds in a row, each with
    the failing rounds' candidate values, limits and incumbent values."""
    found: list[JSONObject] = []
    for i, threshold in enumerate(policy.thresholds):
        run: list[JSONObject] = []
        for r in rounds:
            inc = {k: v for k, v in r.incumbent.metrics().items() if v is not None}
            limit = threshold.resolve(inc)
            observed = r.candidate.metrics().get(threshold.metric)
            if limit.holds(observed) is False:
                run.append(
                    {
                        "candidate": observed,
                        "limit": limit.limit,
                        "incumbent": inc.get(threshold.metric),
                        "at": round(r.candidate.at, 3),
                    }
                )
                if len(run) >= policy.consecutive:
                    found.append(
                        {
                            "threshold": i,
                            "metric": threshold.metric,
                            "op": limit.op,
                            "source": _source(threshold.bound, threshold.value),
                            "rounds": list(run[-policy.consecutive :]),
                        }
                    )
                    break
            else:
                run = []
    return found


def _source(bound: str, value: float) -> str:
    if bound.endswith("_ratio"):
        return f"{value:g} x the incumbent's, same round"
    return f"{bound} {value:g}"


def watch_step(
    policy: WatchPolicy,
    duration_s: float,
    sample_arm: Callable[[str, float], Sample],
    *,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[Round], list[JSONObject]]:
    """Rounds `policy.interval_s` apart for `duration_s` (at least `policy.consecutive` of
    them, so a breach can show in every step); stops at the first breach. `sample_arm(arm,
    clock)` samples "incumbent" or "candidate". Returns the rounds and the breaches."""
    rounds: list[Round] = []
    started = now()
    while True:
        order = ("incumbent", "candidate") if len(rounds) % 2 == 0 else ("candidate", "incumbent")
        taken = {arm: sample_arm(arm, time.time()) for arm in order}
        rounds.append(Round(taken["incumbent"], taken["candidate"], order[0]))
        found = judge(policy, rounds)
        if found:
            return rounds, found
        elapsed = now() - started
        if elapsed >= duration_s and len(rounds) >= policy.consecutive:
            return rounds, []
        sleep(policy.interval_s)
