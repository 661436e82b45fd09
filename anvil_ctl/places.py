"""Where anvilctl's files are: the shipped migrations and recipes, and the default state
directory and host config (never relative to the current directory).

A wheel carries copies of the shipped folders under `anvil_ctl/_shipped/`, which win where
they exist. Light on purpose: shell completion imports it on every <TAB>.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The shipped folder `name` (`migrations` or `recipes`): the wheel's copy, else the repository's."""
    inside = PACKAGE_DIR / "_shipped" / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / name


MIGRATIONS_DIR = shipped_dir("migrations")
RECIPES_DIR = shipped_dir("recipes")


def recipe_base(recipe_dir: Path) -> Path:
    """The directory a recipe's relative mount sources resolve against: its own, except for the
    wheel's copy of the shipped recipes, which stands where the repository keeps them."""
    inside = PACKAGE_DIR / "_shipped" / "recipes"
    if inside.is_dir() and recipe_dir.resolve() == inside.resolve():
        return PACKAGE_DIR.parent / "recipes"
    return recipe_dir


# -- where state and config live when nobody says --------------------------------------------

ROOT_STATE_DIR = Path("/var/lib/anvil")
ROOT_CONFIG = Path("/etc/anvil/anvil.toml")


@dataclass(frozen=True)
class DefaultPaths:
    """The state directory and host config used when neither a flag nor ANVIL_* names them."""

    state_dir: Path
    config: Path
    why: str
    """`root` (the system paths) or `XDG` (the user's data and config directories)."""


def default_paths(env: Mapping[str, str], euid: int) -> DefaultPaths:
    """Fixed places, so every invocation finds one database and one lock: /var/lib/anvil and
    /etc/anvil/anvil.toml as root, else the XDG data and config homes (relative values ignored)."""
    if euid == 0:
        return DefaultPaths(ROOT_STATE_DIR, ROOT_CONFIG, "root")
    home = Path(env.get("HOME") or Path.home())

    def xdg(name: str, fallback: Path) -> Path:
        value = env.get(name) or ""
        return Path(value) if value and Path(value).is_absolute() else fallback

    data = xdg("XDG_DATA_HOME", home / ".local" / "share")
    conf = xdg("XDG_CONFIG_HOME", home / ".config")
    return DefaultPaths(data / "anvil", conf / "anvil" / "anvil.toml", "XDG")


def process_defaults() -> DefaultPaths:
    """`default_paths` of this process (its environment and effective user)."""
    return default_paths(os.environ, os.geteuid())
