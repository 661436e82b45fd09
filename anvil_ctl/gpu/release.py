"""The VRAM-release gate: after stopping a serve, wait until NVML shows its memory freed.

The driver frees a context's memory only when its last process exits, after `docker stop`
returns; starting the next serve before that makes two serves fight for one card.
"""

from __future__ import annotations

from collections.abc import Mapping

from anvil_ctl.core.errors import StepFailed
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import GpuReading
from anvil_ctl.core.ports import Clock, GpuProbe
from anvil_ctl.log import get_logger

log = get_logger()


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
