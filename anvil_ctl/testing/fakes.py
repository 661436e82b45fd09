"""File-backed fakes of the container runtime, engine, router and shared memory.

The world lives in one JSON file guarded by an flock, so that several processes
(a transaction SIGKILLed mid-step and the `recover` that follows it) see the same
host. `make demo` and the engine's unit tests run against it.

This module gathers the fakes from the modules that define them: `world` (the
file and its knobs), `runtime` (containers and engines), `router` (tiers and
acceptance) and `host` (GPUs and shared memory).
"""

from __future__ import annotations

from anvil_ctl.testing.host import FakeGpus, FakeSharedMemory, MemoryShmLedger
from anvil_ctl.testing.router import FakeAcceptanceResult, FakeRouter, fake_acceptance
from anvil_ctl.testing.runtime import FakeRuntime, FakeServerProbe
from anvil_ctl.testing.world import EMPTY, FakeWorld

__all__ = [
    "EMPTY",
    "FakeAcceptanceResult",
    "FakeGpus",
    "FakeRouter",
    "FakeRuntime",
    "FakeServerProbe",
    "FakeSharedMemory",
    "FakeWorld",
    "MemoryShmLedger",
    "fake_acceptance",
]
