"""Real adapters for the World: Docker, the configured router, NVML or simulated GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anvil_ctl.core.errors import ConfigError

if TYPE_CHECKING:
    from anvil_ctl.commands.context import Context
    from anvil_ctl.engine.world import World


def real_world(ctx: Context) -> World:
    raise ConfigError("the real backend is not wired yet; set ANVIL_BACKEND=fake")
