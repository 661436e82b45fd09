"""The World: the ports, config and store one command works with, built at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anvil_ctl.config import HostConfig, Settings
from anvil_ctl.core.ports import (
    Clock,
    ContainerRuntime,
    EngineProbe,
    GpuProbe,
    ModelCache,
    Router,
    SharedMemory,
)
from anvil_ctl.persistence.store import Store


class SystemClock:
    def now(self) -> float:
        import time

        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(seconds)


@dataclass
class World:
    settings: Settings
    config: HostConfig
    store: Store
    runtime: ContainerRuntime
    engine: EngineProbe
    router: Router | None = None
    gpus: GpuProbe | None = None
    shm: SharedMemory | None = None
    model_cache: ModelCache | None = None
    clock: Clock = field(default_factory=SystemClock)
    extras: dict[str, Any] = field(default_factory=dict)
