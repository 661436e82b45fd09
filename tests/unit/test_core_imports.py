"""The core is sans-I/O: it imports no docker, httpx, pynvml or sqlalchemy, nor outer layers."""

from __future__ import annotations

import ast
from pathlib import Path

import anvil_ctl.core

CORE = Path(anvil_ctl.core.__file__).parent
BANNED_ROOTS = {
    "docker",
    "httpx",
    "pynvml",
    "sqlalchemy",
    "alembic",
    "requests",
    "openai",
    "subprocess",
    "socket",
}
BANNED_INTERNAL = (
    "anvil_ctl.adapters",
    "anvil_ctl.persistence",
    "anvil_ctl.engine",
    "anvil_ctl.commands",
    "anvil_ctl.cli",
)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


class TestCoreImports:
    def test_core_has_modules_to_check(self) -> None:
        assert len(list(CORE.glob("*.py"))) >= 6

    def test_core_imports_nothing_outward(self) -> None:
        offenders = {}
        for path in sorted(CORE.glob("*.py")):
            bad = sorted(
                n
                for n in imports_of(path)
                if n.split(".")[0] in BANNED_ROOTS or n.startswith(BANNED_INTERNAL)
            )
            if bad:
                offenders[path.name] = bad
        assert offenders == {}

    def test_the_checker_catches_an_outward_import(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.py"
        bad.write_text("import docker\nfrom sqlalchemy import select\nfrom anvil_ctl.engine import x\n")
        assert {"docker", "sqlalchemy", "anvil_ctl.engine"} <= imports_of(bad)
