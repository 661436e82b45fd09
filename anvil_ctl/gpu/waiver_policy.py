"""Waiver policy: which waiver is in force, and the decisions it reclassifies.

A waiver is active from `created_at` until `expires_at` (exclusive) or `revoked_at`; among
active ones the newest wins. A reclassification is a new decision pointing at the old one and
its evidence; nothing is rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Literal, Protocol

from anvil_ctl.config.fields import NAME_RE
from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import utc_stamp
from anvil_ctl.core.waiver import VRAM_RESERVE, Waiver
from anvil_ctl.gpu.vram import ReserveResult

Outcome = Literal["verified", "policy-infeasible", "failed"]

_DIGEST_RE = re.compile(r"^(sha256:)?[0-9a-f]{64}\Z")


def parse_scope(text: str) -> tuple[frozenset[str], str | None]:
    """`--scope` as the CLI takes it: a recipe digest (64 hex, optional `sha256:`) or ROLE,ROLE."""
    text = text.strip()
    if _DIGEST_RE.match(text):
        return frozenset(), text.removeprefix("sha256:")
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    bad = sorted(r for r in roles if not NAME_RE.match(r))
    if not roles or bad:
        raise BadInput(
            f"waiver scope {text!r}: expected a recipe digest (64 hex) or GPU roles like compute-a,compute-b",
            field="scope",
        )
    return roles, None


@dataclass(frozen=True)
class Effective:
    """A policy value in force, and the waiver that set it (None: the default)."""

    value: int
    waiver_id: str | None = None


def resolve(
    policy: str,
    *,
    policy_default: int,
    role: str,
    recipe_digest: str | None,
    waivers: Iterable[Waiver],
    now: datetime,
) -> Effective:
    """The value in force for one role now: the newest active applicable waiver or the default."""
    newest = _newest(w for w in waivers if w.active(now) and w.applies(policy, role, recipe_digest))
    return Effective(policy_default) if newest is None else Effective(newest.value, newest.id)


def _newest(waivers: Iterable[Waiver]) -> Waiver | None:
    return max(waivers, key=lambda w: (w.created_at, w.id), default=None)


class GateVerdict(Protocol):
    """What reclassification needs of any gate result."""

    @property
    def name(self) -> str: ...

    @property
    def passed(self) -> bool: ...


@dataclass(frozen=True)
class Decision:
    """A qualify decision bound to a candidate identity; `reclassifies` points at an earlier one."""

    id: str
    outcome: Outcome
    identity_digest: str
    evidence_id: str
    recipe_digest: str | None = None
    reclassifies: str | None = None
    waiver_ids: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    decided_at: datetime | None = None

    def as_dict(self) -> JSONObject:
        return {
            **asdict(self),
            "waiver_ids": [*self.waiver_ids],
            "reasons": [*self.reasons],
            "decided_at": None if self.decided_at is None else utc_stamp(self.decided_at),
        }


@dataclass(frozen=True)
class WaivedVerdict:
    """A failed gate whose failure a gate waiver waives: judged as passing, named as waived."""

    name: str
    waiver_id: str
    passed: bool = True


def outcome_of(results: Sequence[GateVerdict]) -> tuple[Outcome, tuple[str, ...]]:
    """verified: all pass; policy-infeasible: only policy gates fail; else failed."""
    failed = [r for r in results if not r.passed]
    waived = tuple(
        f"{r.name} failed, waived by {r.waiver_id}" for r in results if isinstance(r, WaivedVerdict)
    )
    reasons = tuple(f"{r.name} failed" for r in failed) + waived
    if not failed:
        return "verified", waived
    if all(isinstance(r, ReserveResult) for r in failed):
        return "policy-infeasible", reasons
    return "failed", reasons


def reclassify(
    decision: Decision,
    results: Sequence[GateVerdict],
    waivers: Iterable[Waiver],
    now: datetime,
) -> Decision:
    """A NEW decision re-judging the same evidence under the waivers active at `now`.

    Reserve results are judged against the reserve in force, failed gates a gate waiver names are
    waived, the rest stand; its ID is a digest of what it says (idempotent).
    """
    waivers, digest = list(waivers), decision.recipe_digest
    used: set[str] = set()
    rejudged: list[GateVerdict] = []
    for result in results:
        if not isinstance(result, ReserveResult):
            # The newest active gate waiver of this recipe that names the failed gate, if any.
            waiver = None
            if not result.passed:
                named = (w for w in waivers if w.active(now) and w.waives_gate(result.name, digest))
                waiver = _newest(named)
            if waiver is not None:
                used.add(waiver.id)
                rejudged.append(WaivedVerdict(result.name, waiver.id))
            else:
                rejudged.append(result)
            continue
        thresholds = {}
        for card in result.cards:
            eff = resolve(
                VRAM_RESERVE,
                policy_default=card.threshold_mib,
                role=card.role,
                recipe_digest=digest,
                waivers=waivers,
                now=now,
            )
            thresholds[card.role] = eff.value
            if eff.waiver_id is not None:
                used.add(eff.waiver_id)
        rejudged.append(result.rejudged(thresholds))
    outcome, reasons = outcome_of(rejudged)
    waiver_ids = tuple(sorted(used))
    body = {
        "reclassifies": decision.id,
        "evidence_id": decision.evidence_id,
        "identity_digest": decision.identity_digest,
        "outcome": outcome,
        "waiver_ids": list(waiver_ids),
    }
    return replace(
        decision,  # the same candidate, evidence and recipe
        id="dec-" + sha256_hex(body)[:16],
        outcome=outcome,
        reclassifies=decision.id,
        waiver_ids=waiver_ids,
        reasons=reasons,
        decided_at=now,
    )


UNWAIVABLE_GATES = frozenset({"served-identity", "engine-alive"})
"""Facts about the candidate, not measurements of it: no waiver can make them pass."""


def check_gate_waiver(scope: str, gates: tuple[str, ...], value: int) -> None:
    """A gate waiver's scope, gates and value, checked before anything is written."""
    roles, digest = parse_scope(scope)
    if roles or not digest:
        raise BadInput(
            f"--scope {scope!r}: a gate waiver applies to one recipe digest (64 hex; "
            "`anvilctl recipes show NAME` prints it)",
            field="scope",
        )
    if not gates:
        raise BadInput("--gates: expected the gates whose failure is waived, e.g. smoke,json", field="gates")
    bad = sorted(set(gates) & UNWAIVABLE_GATES)
    if bad:
        raise BadInput(
            f"--gates: {', '.join(bad)} cannot be waived (they are not measurements)", field="gates"
        )
    if value != 0:
        raise BadInput(f"--value {value}: a gate waiver's value is 0 (not required)", field="value")
