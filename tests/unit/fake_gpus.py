"""GPU fakes for unit tests: a probe whose readings change after polls, and a clock that never waits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from anvil_ctl.core.model import GpuProcess, GpuReading


class ManualClock:
    """A Clock for tests: `sleep` advances `now` at once and is recorded."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def reading(
    uuid: str,
    total_mib: int = 143_771,
    used_mib: int = 0,
    *,
    index: int = 0,
    name: str = "Fake H200",
    processes: Iterable[GpuProcess] = (),
) -> GpuReading:
    """A consistent reading (free = total - used) for tests."""
    return GpuReading(uuid, name, index, total_mib, used_mib, total_mib - used_mib, tuple(processes))


class FakeGpuProbe:
    """In-memory GpuProbe; `set_used` changes a card now, `after_polls` changes it later."""

    def __init__(self, readings: Iterable[GpuReading] = (), driver: str = "fake-1.0") -> None:
        self._readings = {r.uuid: r for r in readings}
        self.driver = driver
        self.polls = 0
        self._scheduled: list[tuple[int, str, int, tuple[GpuProcess, ...]]] = []
        self.error: Exception | None = None

    def set_used(self, uuid: str, used_mib: int, processes: Iterable[GpuProcess] = ()) -> None:
        old = self._readings[uuid]
        free_mib = old.total_mib - used_mib
        self._readings[uuid] = replace(old, used_mib=used_mib, free_mib=free_mib, processes=tuple(processes))

    def after_polls(self, polls: int, uuid: str, used_mib: int, processes: Iterable[GpuProcess] = ()) -> None:
        """From the `polls`-th call of `gpus()` on (1-based), the card holds `used_mib`."""
        self._scheduled.append((polls, uuid, used_mib, tuple(processes)))

    def gpus(self) -> list[GpuReading]:
        self.polls += 1
        if self.error is not None:
            raise self.error
        for due in [s for s in self._scheduled if s[0] <= self.polls]:
            self._scheduled.remove(due)
            self.set_used(due[1], due[2], due[3])
        return sorted(self._readings.values(), key=lambda r: r.index)

    def driver_version(self) -> str:
        return self.driver
