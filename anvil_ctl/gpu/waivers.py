"""Waivers: attributed, scoped, expiring exceptions to one policy value, and what they reclassify.

A waiver changes one policy value (today `vram-reserve`, in MiB per card) for a
scope: a set of GPU roles, or one recipe digest. It is active from `created_at`
until `expires_at` (exclusive) or `revoked_at`, whichever comes first, so the
question "was it in force at time T" has one answer forever. When several
active waivers apply, the most recently created wins: a later operator
decision supersedes an earlier one.

A decision computed under a waiver is a new record pointing at the decision it
reclassifies and at the same evidence; the original is never changed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import sha256_hex
from anvil_ctl.gpu.reserve import POLICY as VRAM_RESERVE
from anvil_ctl.gpu.reserve import ReserveResult

POLICIES = (VRAM_RESERVE,)
Outcome = Literal["verified", "policy-infeasible", "failed"]

_DIGEST_RE = re.compile(r"^(sha256:)?[0-9a-f]{64}$")
_ROLE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def parse_scope(text: str) -> tuple[frozenset[str], str | None]:
    """`--scope` as the CLI takes it: a recipe digest (64 hex, optional `sha256:`) or ROLE,ROLE."""
    text = text.strip()
    if _DIGEST_RE.match(text):
        return frozenset(), text.removeprefix("sha256:")
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    bad = sorted(r for r in roles if not _ROLE_RE.match(r))
    if not roles or bad:
        raise BadInput(
            f"waiver scope {text!r}: expected a recipe digest (64 hex) or GPU roles like compute-a,compute-b",
            field="scope",
        )
    return roles, None


@dataclass(frozen=True)
class Waiver:
    """One attributed exception: `policy` takes `value` within the scope, for a while."""

    id: str
    policy: str
    value: int
    approved_by: str
    reason: str
    created_at: datetime
    roles: frozenset[str] = frozenset()
    recipe_digest: str | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.policy not in POLICIES:
            problems.append(f"policy {self.policy!r}: expected one of {list(POLICIES)}")
        if bool(self.roles) == bool(self.recipe_digest):
            problems.append("scope: expected either GPU roles or a recipe digest, not both")
        if self.value < 0:
            problems.append("value: expected MiB >= 0")
        if not self.approved_by.strip():
            problems.append("approved_by: expected the approver's name")
        if not self.reason.strip():
            problems.append("reason: expected why the policy is waived")
        times = [self.created_at, self.expires_at, self.revoked_at]
        if any(t is not None and t.utcoffset() is None for t in times):
            problems.append("times: expected timezone-aware datetimes")
        elif self.expires_at is not None and self.expires_at <= self.created_at:
            problems.append("expires_at: expected a time after created_at")
        if problems:
            raise BadInput(f"waiver {self.id}: " + "; ".join(problems), field="waiver")

    @property
    def scope(self) -> str:
        return f"recipe {self.recipe_digest}" if self.recipe_digest else ",".join(sorted(self.roles))

    def active(self, now: datetime) -> bool:
        if now < self.created_at:
            return False
        if self.expires_at is not None and now >= self.expires_at:
            return False
        return self.revoked_at is None or now < self.revoked_at

    def applies(self, policy: str, role: str, recipe_digest: str | None) -> bool:
        if policy != self.policy:
            return False
        if self.recipe_digest is not None:
            return recipe_digest is not None and recipe_digest.removeprefix("sha256:") == (
                self.recipe_digest.removeprefix("sha256:")
            )
        return role in self.roles

    def revoked(self, at: datetime) -> Waiver:
        """A copy revoked at `at` (the store appends it as a revocation row)."""
        return replace(self, revoked_at=at)

    def as_dict(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return None if t is None else t.isoformat()

        return {
            "id": self.id,
            "policy": self.policy,
            "value": self.value,
            "roles": sorted(self.roles),
            "recipe_digest": self.recipe_digest,
            "approved_by": self.approved_by,
            "reason": self.reason,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Waiver:
        def when(key: str) -> datetime | None:
            value = data.get(key)
            return None if value is None else datetime.fromisoformat(value)

        created = when("created_at")
        if created is None:
            raise BadInput(f"waiver {data.get('id')}: created_at missing", field="created_at")
        return cls(
            id=data["id"],
            policy=data["policy"],
            value=int(data["value"]),
            roles=frozenset(data.get("roles") or ()),
            recipe_digest=data.get("recipe_digest"),
            approved_by=data["approved_by"],
            reason=data["reason"],
            created_at=created,
            expires_at=when("expires_at"),
            revoked_at=when("revoked_at"),
        )


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
    applicable = [w for w in waivers if w.active(now) and w.applies(policy, role, recipe_digest)]
    if not applicable:
        return Effective(policy_default)
    newest = max(applicable, key=lambda w: (w.created_at, w.id))
    return Effective(newest.value, newest.id)


def effective_reserve(
    policy_default: int,
    role: str,
    recipe_digest: str | None,
    waivers: Iterable[Waiver],
    now: datetime,
) -> int:
    """The VRAM reserve in MiB in force for `role` (and the serve's recipe digest) at `now`."""
    return resolve(
        VRAM_RESERVE,
        policy_default=policy_default,
        role=role,
        recipe_digest=recipe_digest,
        waivers=waivers,
        now=now,
    ).value


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
    reasons: tuple[str, ...] = field(default=())
    decided_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "identity_digest": self.identity_digest,
            "evidence_id": self.evidence_id,
            "recipe_digest": self.recipe_digest,
            "reclassifies": self.reclassifies,
            "waiver_ids": list(self.waiver_ids),
            "reasons": list(self.reasons),
            "decided_at": None if self.decided_at is None else self.decided_at.isoformat(),
        }


def outcome_of(results: Sequence[GateVerdict]) -> tuple[Outcome, tuple[str, ...]]:
    """verified: all pass; policy-infeasible: only policy gates fail; else failed."""
    failed = [r for r in results if not r.passed]
    policy_failed = [r for r in failed if isinstance(r, ReserveResult)]
    reasons = tuple(f"{r.name} failed" for r in failed)
    if not failed:
        return "verified", ()
    if len(policy_failed) == len(failed):
        return "policy-infeasible", reasons
    return "failed", reasons


def reclassify(
    decision: Decision,
    results: Sequence[GateVerdict],
    waivers: Iterable[Waiver],
    now: datetime,
) -> Decision:
    """A NEW decision re-judging the same evidence under the waivers active at `now`.

    Reserve results are re-judged with each card's threshold replaced by the
    value in force (their recorded threshold is the policy default); other gate
    results stand as recorded. The new decision points at `decision` and at its
    evidence; `decision` and `results` are not changed. Its ID is a digest of
    what it says, so reclassifying twice under the same waivers gives one ID.
    """
    waivers = list(waivers)
    used: set[str] = set()
    rejudged: list[GateVerdict] = []
    for result in results:
        if not isinstance(result, ReserveResult):
            rejudged.append(result)
            continue
        thresholds = {}
        for card in result.cards:
            eff = resolve(
                VRAM_RESERVE,
                policy_default=card.threshold_mib,
                role=card.role,
                recipe_digest=decision.recipe_digest,
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
    return Decision(
        id="dec-" + sha256_hex(body)[:16],
        outcome=outcome,
        identity_digest=decision.identity_digest,
        evidence_id=decision.evidence_id,
        recipe_digest=decision.recipe_digest,
        reclassifies=decision.id,
        waiver_ids=waiver_ids,
        reasons=reasons,
        decided_at=now,
    )
