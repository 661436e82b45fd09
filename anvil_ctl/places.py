"""Where anvilctl's files are: the ones it ships (migrations, recipes) and the state directory
and host config it uses when nobody names them.

Shipped: the repository keeps them at its top level (`migrations/`, `recipes/`): their
documented places and the source of truth. A wheel carries copies inside the
package, under `anvil_ctl/_shipped/` (setup.py's build step puts them there), so
an installed `anvilctl` works from any directory. The wheel's copy wins where it
exists; a source checkout or an editable install reads the repository's folders.
Profiles and fixtures are ordinary package data (`anvil_ctl/profiles/`, `fixtures/`).

Defaults: never relative to the current directory (`default_paths`). Light on purpose:
shell completion imports it on every <TAB>.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The shipped folder `name` (`migrations` or `recipes`): the wheel's copy, else the
    repository's."""
    inside = PACKAGE_DIR / "_shipped" / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / name


MIGRATIONS_DIR = shipped_dir("migrations")
RECIPES_DIR = shipped_dir("recipes")


def recipe_base(recipe_dir: Path) -> Path:
    """The directory a recipe's relative mount sources resolve against: its own, except for
    the wheel's copy of the shipped recipes, which stands where the repository keeps them,
    beside the package (so the stub recipes' `../anvil_ctl/stub` names the installed package)."""
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
    """Fixed places, never relative to the current directory, so that every invocation on a
    host finds one database and one lock: /var/lib/anvil and /etc/anvil/anvil.toml as root;
    otherwise $XDG_DATA_HOME/anvil and $XDG_CONFIG_HOME/anvil/anvil.toml (~/.local/share
    and ~/.config when unset; a relative XDG value is ignored, as the XDG spec says)."""
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
