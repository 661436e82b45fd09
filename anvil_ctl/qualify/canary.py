"""A canary's arithmetic, its sample and its verdict: the traffic shares it steps through, the
side-by-side round (`SideBySide`, both serves on the same prompts, the order alternating per round
so host load falls on both alike) and `judge`: the `[watch]` thresholds hold the candidate, a
relative one against the incumbent's value in the same round ("at most 1.25 x the incumbent's, on
the same prompts, at the same moment"); failed in `consecutive` rounds in a row, a breach.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence

import openai
from pydantic import TypeAdapter

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONMapping, JSONObject
from anvil_ctl.qualify.slosample import sample
from anvil_ctl.qualify.watchpolicy import Threshold, WatchPolicy, metrics_of

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


ARMS = ("incumbent", "candidate")


class SideBySide:
    """One round of a canary's step: both serves sampled on the same prompts, each at its own
    binding, the incumbent first in even rounds and the candidate first in odd ones. The
    round is the sample `engine.watch.watch` takes; `judge` judges it."""

    def __init__(
        self, clients: Mapping[str, openai.OpenAI], models: Mapping[str, str], policy: WatchPolicy
    ) -> None:
        self.clients, self.models, self.policy = clients, models, policy

    def __call__(self, n: int) -> JSONObject:
        order = ARMS if n % 2 == 0 else ARMS[::-1]
        taken = {
            arm: sample(
                self.clients[arm],
                self.models[arm],
                requests=self.policy.requests,
                max_tokens=self.policy.max_tokens,
                clock=time.time(),
            ).as_dict()
            for arm in order
        }
        return {"first": order[0], **taken}


def _arm(round_: JSONMapping, arm: str) -> dict[str, float | None]:
    found = round_.get(arm)
    return metrics_of(found) if isinstance(found, dict) else {}


def summary(rounds: Sequence[JSONMapping]) -> str:
    """One line for `audit show`: each serve's worst TTFT p95 and error rate over the rounds."""

    def worst(arm: str, metric: str) -> float | None:
        known = [v for r in rounds if (v := _arm(r, arm).get(metric)) is not None]
        return max(known) if known else None

    def arm(name: str) -> str:
        ttft, errors = worst(name, "ttft_p95_s"), worst(name, "error_rate")
        shown = "-" if ttft is None else f"{ttft:.3f} s"
        return f"{name} ttft_p95 <= {shown}, error_rate <= {errors or 0:.0%}"

    return f"{len(rounds)} round(s): {arm('candidate')}; {arm('incumbent')}"


def judge(policy: WatchPolicy, rounds: Sequence[JSONMapping]) -> list[JSONObject]:
    """The thresholds the candidate failed in each of the newest `policy.consecutive` rounds,
    each with those rounds' candidate values, limits and incumbent values."""
    newest = rounds[-policy.consecutive :]
    found: list[JSONObject] = []
    for i, threshold in enumerate(policy.thresholds):
        failed = [f for r in newest if (f := _failed(threshold, r)) is not None]
        if len(failed) == policy.consecutive:
            source = f"{threshold.value:g} x the incumbent's, same round" if threshold.relative else ""
            found.append(
                {
                    "threshold": i,
                    "metric": threshold.metric,
                    "op": "max" if threshold.bound.startswith("max") else "min",
                    "source": source or f"{threshold.bound} {threshold.value:g}",
                    "rounds": [*failed],
                }
            )
    return found


def _failed(threshold: Threshold, round_: JSONMapping) -> JSONObject | None:
    """The candidate's value, its limit (resolved against the incumbent's value in the same
    round) and the incumbent's, when the candidate failed it; None when it held or the round
    cannot judge it (the incumbent measured nothing to be relative to)."""
    inc = {k: v for k, v in _arm(round_, "incumbent").items() if v is not None}
    limit = threshold.resolve(inc)
    observed = _arm(round_, "candidate").get(threshold.metric)
    if limit.holds(observed) is not False:
        return None
    cand = round_.get("candidate")
    at = cand.get("at") if isinstance(cand, dict) else None
    return {"candidate": observed, "limit": limit.limit, "incumbent": inc.get(threshold.metric), "at": at}
