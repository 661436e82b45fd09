"""Build the objects one command needs from Settings: store, host config, world.

This is the only place that chooses real adapters or fakes (Settings.backend)
and real or simulated GPUs (Settings.gpu).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from anvil_ctl.config import HostConfig, Settings, load_host_config
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.engine import gpu_hooks
from anvil_ctl.engine.owner import current_owner
from anvil_ctl.engine.world import World
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import check_revision
from anvil_ctl.persistence.store import Store


@dataclass
class Context:
    settings: Settings
    env: dict[str, str]

    @cached_property
    def engine(self) -> Any:
        if self.settings.db_url.startswith("sqlite"):
            self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        return make_engine(self.settings.db_url)

    @cached_property
    def store(self) -> Store:
        check_revision(self.engine)
        return Store(self.engine)

    @cached_property
    def config(self) -> HostConfig:
        return load_host_config(self.settings.config)

    @cached_property
    def owner(self) -> Any:
        return current_owner()

    def world(self) -> World:
        """The one World of this command (built on first use)."""
        cached: World | None = self.__dict__.get("_world")
        if cached is None:
            cached = self._fake_world() if self.settings.backend == "fake" else self._real_world()
            self.__dict__["_world"] = cached
        return cached

    def close(self) -> None:
        """Close the adapters' connections (Docker, router HTTP clients)."""
        world: World | None = self.__dict__.pop("_world", None)
        if world is None:
            return
        for part in (world.runtime, world.router, world.engine, world.gpus):
            close = getattr(part, "close", None)
            if callable(close):
                close()

    def _fake_world(self) -> World:
        from anvil_ctl.testing.fakes import (
            FakeEngineProbe,
            FakeGpus,
            FakeRouter,
            FakeRuntime,
            FakeSharedMemory,
            FakeWorld,
        )

        fw = FakeWorld(self.settings.fake_world_path)
        world = World(
            settings=self.settings,
            config=self.config,
            store=self.store,
            runtime=FakeRuntime(fw),
            engine=FakeEngineProbe(fw),
            router=FakeRouter(fw) if self.config.router.kind != "none" else None,
            gpus=FakeGpus(fw),
            shm=FakeSharedMemory(fw),
        )
        if self.config.model_cache_dir is not None:
            from anvil_ctl.adapters.hfcache import HfCache

            world.model_cache = HfCache(self.config.model_cache_dir)
        if world.router is not None:
            from anvil_ctl.testing.fakes import fake_acceptance

            world.extras["acceptance"] = fake_acceptance(world.router)
        return gpu_hooks.install(world)

    def _real_world(self) -> World:
        from anvil_ctl.commands import wiring

        return wiring.real_world(self)


def require(value: Any, what: str) -> Any:
    if value is None:
        raise ConfigError(f"{what} is required")
    return value
