"""The waiver value type: an attributed, scoped, expiring exception to one policy value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import utc_stamp

VRAM_RESERVE = "vram-reserve"
"""The VRAM reserve policy: MiB each card keeps free after the workload."""

GATE = "gate"
"""The functional-gate policy: a gate is required (1); a waiver sets 0 for named gates of one
recipe, whose failure is still recorded but no longer fails the decision."""

POLICIES = (VRAM_RESERVE, GATE)


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
    gates: frozenset[str] = frozenset()
    """With policy `gate`: the gates (by name) whose failure is waived."""

    def __post_init__(self) -> None:
        problems = []
        if self.policy not in POLICIES:
            problems.append(f"policy {self.policy!r}: expected one of {list(POLICIES)}")
        if self.policy == GATE:
            if not self.recipe_digest or self.roles:
                problems.append("scope: a gate waiver applies to one recipe digest (no GPU roles)")
            if not self.gates:
                problems.append("gates: expected the names of the gates whose failure is waived")
            if self.value != 0:
                problems.append("value: expected 0 (the gates are not required)")
        else:
            if bool(self.roles) == bool(self.recipe_digest):
                problems.append("scope: expected either GPU roles or a recipe digest, not both")
            if self.gates:
                problems.append(f"gates: only a {GATE!r} waiver names gates")
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

    def active(self, now: datetime) -> bool:
        if now < self.created_at:
            return False
        if self.expires_at is not None and now >= self.expires_at:
            return False
        return self.revoked_at is None or now < self.revoked_at

    def waives_gate(self, gate: str, recipe_digest: str | None) -> bool:
        """A gate waiver naming `gate`, for this recipe digest (activity is the caller's check)."""
        return self.policy == GATE and gate in self.gates and self.applies(GATE, "", recipe_digest)

    def applies(self, policy: str, role: str, recipe_digest: str | None) -> bool:
        if policy != self.policy:
            return False
        if self.recipe_digest is not None:
            return recipe_digest is not None and recipe_digest.removeprefix("sha256:") == (
                self.recipe_digest.removeprefix("sha256:")
            )
        return role in self.roles

    def as_dict(self) -> JSONObject:
        def iso(t: datetime | None) -> str | None:
            return None if t is None else utc_stamp(t)

        return {
            "id": self.id,
            "policy": self.policy,
            "value": self.value,
            "roles": list(sorted(self.roles)),
            "gates": list(sorted(self.gates)),
            "recipe_digest": self.recipe_digest,
            "approved_by": self.approved_by,
            "reason": self.reason,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
        }
