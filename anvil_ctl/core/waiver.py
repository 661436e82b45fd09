"""The waiver value type: an attributed, scoped, expiring exception to one policy value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
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

    @property
    def scope(self) -> str:
        if self.gates:
            return f"recipe {self.recipe_digest} gates {','.join(sorted(self.gates))}"
        return f"recipe {self.recipe_digest}" if self.recipe_digest else ",".join(sorted(self.roles))

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

    def revoked(self, at: datetime) -> Waiver:
        """A copy revoked at `at` (the store appends it as a revocation row)."""
        return replace(self, revoked_at=at)

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

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Waiver:
        """A waiver as `as_dict` wrote it; a field of another type is BadInput naming it."""

        def wrong(key: str, expected: str) -> BadInput:
            got = type(data[key]).__name__
            return BadInput(f"waiver {data.get('id')}: {key}: expected {expected}, got {got}", field=key)

        def text(key: str) -> str:
            value = data[key]
            if not isinstance(value, str):
                raise wrong(key, "a string")
            return value

        def when(key: str) -> datetime | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, str):
                raise wrong(key, "an ISO 8601 time")
            return datetime.fromisoformat(value)

        created = when("created_at")
        if created is None:
            raise BadInput(f"waiver {data.get('id')}: created_at missing", field="created_at")
        value = data["value"]
        if not isinstance(value, int | float | str):
            raise wrong("value", "MiB")
        roles = data.get("roles") or ()
        if not isinstance(roles, list | tuple | set | frozenset):
            raise wrong("roles", "a list of GPU roles")
        if not all(isinstance(r, str) for r in roles):
            raise wrong("roles", "a list of GPU roles")
        gates = data.get("gates") or ()
        if not isinstance(gates, list | tuple | set | frozenset) or not all(
            isinstance(g, str) for g in gates
        ):
            raise wrong("gates", "a list of gate names")
        digest = data.get("recipe_digest")
        if digest is not None and not isinstance(digest, str):
            raise wrong("recipe_digest", "a string")
        return cls(
            id=text("id"),
            policy=text("policy"),
            value=int(value),
            roles=frozenset(str(r) for r in roles),
            gates=frozenset(str(g) for g in gates),
            recipe_digest=digest,
            approved_by=text("approved_by"),
            reason=text("reason"),
            created_at=created,
            expires_at=when("expires_at"),
            revoked_at=when("revoked_at"),
        )
