"""The two VRAM gates: the release gate, and the reserve policy gate.

Release: after stopping a serve, wait until NVML shows its memory freed. The driver frees a
context's memory only when its last process exits, after `docker stop` returns; starting the
next serve before that makes two serves fight for one card.

Reserve: after the workload each card must keep the reserve free. Exactly the reserve free
passes; a card the probe did not report fails (an unobserved reserve is not a kept one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from anvil_ctl.core.errors import ConfigError, StepFailed
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import GpuReading
from anvil_ctl.core.ports import Clock, GpuProbe
from anvil_ctl.core.waiver import VRAM_RESERVE
from anvil_ctl.log import get_logger

log = get_logger()

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


def _card(reading: GpuReading | None) -> JSONObject | None:
    if reading is None:
        return None
    return {
        "index": reading.index,
        "total_mib": reading.total_mib,
        "used_mib": reading.used_mib,
        "free_mib": reading.free_mib,
        "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in reading.processes],
    }


def _observe(probe: GpuProbe, uuids: Mapping[str, str]) -> dict[str, GpuReading | None]:
    by_uuid = {r.uuid.lower(): r for r in probe.gpus()}
    return {uuid: by_uuid.get(uuid.lower()) for uuid in uuids.values()}


def wait_for_vram_release(
    probe: GpuProbe,
    clock: Clock,
    uuids: Mapping[str, str],
    *,
    need_mib: int | Mapping[str, int],
    reserve_mib: int | Mapping[str, int],
    deadline_s: float,
    poll_s: float = 1.0,
    first_poll_s: float | None = None,
) -> JSONObject:
    """Poll until every role's card has `free >= need + reserve`; return the readings as a step record.

    Polls start `first_poll_s` apart and grow by a quarter up to `poll_s`. At the deadline, or at
    once when a card is missing or too small, raise StepFailed carrying the same record.
    """

    def per_role(value: int | Mapping[str, int], role: str) -> int:
        return value if isinstance(value, int) else value[role]

    required = {uuid: per_role(need_mib, r) + per_role(reserve_mib, r) for r, uuid in uuids.items()}
    role_of = {uuid: role for role, uuid in uuids.items()}
    start = clock.now()
    before = _observe(probe, uuids)
    current = before
    polls = 1
    pause = poll_s if first_poll_s is None else min(first_poll_s, poll_s)

    def record(satisfied: bool) -> JSONObject:
        return {
            "roles": {**uuids},
            "required_free_mib": {**required},
            "before": {u: _card(r) for u, r in before.items()},
            "after": {u: _card(r) for u, r in current.items()},
            "waited_s": round(clock.now() - start, 3),
            "polls": polls,
            "deadline_s": deadline_s,
            "released": satisfied,
        }

    while True:
        missing = [u for u, r in current.items() if r is None]
        if missing:
            names = ", ".join(f"{role_of[u]} ({u})" for u in missing)
            raise StepFailed(f"VRAM release: GPU not visible to the probe: {names}", **record(False))
        short = {u: r for u, r in current.items() if r is not None and r.free_mib < required[u]}
        if not short:
            result = record(True)
            log.info("gpu.vram_released", waited_s=result["waited_s"], polls=polls)
            return result
        impossible = [u for u, r in short.items() if r.total_mib < required[u]]
        if impossible:
            names = ", ".join(
                f"{role_of[u]} needs {required[u]} MiB free of {short[u].total_mib}" for u in impossible
            )
            raise StepFailed(f"VRAM release can never succeed: {names}", **record(False))
        if clock.now() - start >= deadline_s:
            names = ", ".join(
                f"{role_of[u]} free {r.free_mib} MiB < {required[u]} MiB" for u, r in short.items()
            )
            raise StepFailed(f"VRAM not released within {deadline_s:g} s: {names}", **record(False))
        clock.sleep(pause)
        pause = min(pause * 1.25, poll_s)
        current = _observe(probe, uuids)
        polls += 1
