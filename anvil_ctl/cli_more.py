"""Subcommands of the later subsystems (recipes, load/unload, qualify, promote, rollback...)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    return None
