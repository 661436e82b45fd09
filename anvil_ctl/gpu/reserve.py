"""The VRAM reserve policy gate: after the workload each card must keep the reserve free.

Exactly the reserve free passes; a card the probe did not report fails (an unobserved reserve
is not a kept one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import GpuReading
from anvil_ctl.core.waiver import VRAM_RESERVE

POLICY = VRAM_RESERVE


@dataclass(frozen=True)
class CardCheck:
    """One card's reading against its threshold."""

    role: str
    uuid: str
    threshold_mib: int
    free_mib: int | None
    used_mib: int | None = None
    total_mib: int | None = None

    @property
    def margin_mib(self) -> int | None:
        return None if self.free_mib is None else self.free_mib - self.threshold_mib

    @property
    def passed(self) -> bool:
        return self.free_mib is not None and self.free_mib >= self.threshold_mib

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "margin_mib": self.margin_mib, "passed": self.passed}


@dataclass(frozen=True)
class ReserveResult:
    """The gate's verdict with every reading: what goes into the transaction's evidence."""

    cards: tuple[CardCheck, ...]
    name: str = POLICY
    policy: str = POLICY

    @property
    def passed(self) -> bool:
        return bool(self.cards) and all(c.passed for c in self.cards)

    @property
    def threshold_mib(self) -> dict[str, int]:
        return {c.role: c.threshold_mib for c in self.cards}

    @property
    def margin_mib(self) -> int | None:
        """The smallest margin over all cards (negative: short by that much); None if unobserved."""
        margins = [c.margin_mib for c in self.cards]
        if not margins or any(m is None for m in margins):
            return None
        return min(m for m in margins if m is not None)

    def evidence(self) -> JSONObject:
        return {
            "gate": self.name,
            "policy": self.policy,
            "passed": self.passed,
            "threshold_mib": {**self.threshold_mib},
            "margin_mib": self.margin_mib,
            "cards": [c.as_dict() for c in self.cards],
        }

    def rejudged(self, thresholds: Mapping[str, int]) -> ReserveResult:
        """The same readings against other thresholds (roles not named keep theirs)."""
        cards = tuple(replace(c, threshold_mib=thresholds.get(c.role, c.threshold_mib)) for c in self.cards)
        return replace(self, cards=cards)


class VramReserveGate:
    """Passes when every card keeps at least its reserve (role -> MiB, after waivers) free."""

    name = POLICY

    def __init__(self, reserve_mib: Mapping[str, int], uuids: Mapping[str, str]) -> None:
        missing = sorted(set(reserve_mib) - set(uuids))
        if missing:
            raise ConfigError(f"reserve gate: no GPU UUID for roles {missing}", field="gpu_roles")
        if any(v < 0 for v in reserve_mib.values()):
            raise ConfigError("reserve gate: a reserve cannot be negative", field="reserve_mib")
        self.reserve_mib = dict(reserve_mib)
        self.uuids = {role: uuids[role] for role in reserve_mib}

    def __call__(self, readings: Sequence[GpuReading]) -> ReserveResult:
        by_uuid = {r.uuid.lower(): r for r in readings}
        cards = []
        for role in sorted(self.reserve_mib):
            uuid = self.uuids[role]
            r = by_uuid.get(uuid.lower())
            free, used, total = (r.free_mib, r.used_mib, r.total_mib) if r else (None, None, None)
            cards.append(CardCheck(role, uuid, self.reserve_mib[role], free, used, total))
        return ReserveResult(cards=tuple(cards))
