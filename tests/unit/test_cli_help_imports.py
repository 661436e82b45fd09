"""`anvilctl --help` and every `anvilctl CMD [SUB] --help` stay fast: no heavy module is imported.

Each help runs in a fresh interpreter (`python -c`), which then reports `sys.modules`.
Command implementations must be imported when the callback runs (inside it, or as a
`cli.session.Lazy` module), and help text and choices must come from light modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import click

from anvil_ctl.cli.app import root

HEAVY = (
    "sqlalchemy",
    "alembic",
    "docker",
    "httpx",
    "openai",
    "pynvml",
    "rich",
    "structlog",
    "pydantic_settings",
    "anvil_ctl.qualify",
    "anvil_ctl.persistence",
    "anvil_ctl.adapters",
    "anvil_ctl.engine",
    "anvil_ctl.core.engine_profile",
    # not heavy, but its 12 frozen dataclasses cost 7 ms of a 30 ms budget: handlers import it
    "anvil_ctl.cli.views",
)

CHILD = """
import importlib, json, os, sys
plant = os.environ.get("PLANT_IMPORT")
if plant:
    importlib.import_module(plant)
from anvil_ctl.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The root and every command path below it: (), ('audit',), ('audit', 'transactions'), ..."""
    paths = [path]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            paths.extend(command_paths(sub, (*path, name)))
    return paths


def heavy_imports_of_help(path: tuple[str, ...], plant: str | None = None) -> list[str]:
    """The heavy modules a fresh interpreter holds after `anvilctl PATH --help`."""
    env = {**os.environ, **({"PLANT_IMPORT": plant} if plant else {})}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, *path, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, r.stderr
    assert "Usage: anvilctl" in r.stdout
    return [m for m in report["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]


class TestHelpImports:
    def test_the_tree_has_every_level_to_check(self) -> None:
        paths = command_paths(root)
        assert () in paths and ("audit", "transactions") in paths and ("gpus", "detect") in paths
        assert len(paths) > 40

    def test_no_help_imports_a_heavy_module(self) -> None:
        paths = command_paths(root)
        with ThreadPoolExecutor(max_workers=4) as pool:
            found = dict(zip(paths, pool.map(heavy_imports_of_help, paths), strict=True))
        offenders = {" ".join(p) or "(root)": heavy for p, heavy in found.items() if heavy}
        assert offenders == {}

    def test_the_check_catches_a_heavy_import(self) -> None:
        assert "sqlalchemy" in heavy_imports_of_help(("audit", "transactions"), plant="sqlalchemy")
        assert "anvil_ctl.engine.runner" in heavy_imports_of_help((), plant="anvil_ctl.engine.runner")
