"""`Any` stays at the adapter edge: mypy --strict checks everything else.

`typing.Any` turns type checking off for every value it touches, so a package that
spells it everywhere passes `mypy --strict` without being checked. The rule: `Any`
may appear only in `anvil_ctl/adapters/` (where the docker SDK, pynvml and httpx hand
back untyped values, narrowed before they leave the adapter) and in the modules
`ALLOWED` names below with their count, each with the reason. Open JSON documents are
typed with `anvil_ctl.core.jsontypes`.

The scan is static (`ast`): an import of `Any` from `typing` (or `typing_extensions`),
an attribute `typing.Any`, and every use of the name `Any` count, inside annotations
given as strings too. Each rule has a twin that plants a violation and shows the
checker reports it.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import anvil_ctl

PACKAGE_DIR = Path(anvil_ctl.__file__).parent

#: Where `Any` may stand without limit: the adapter edge.
EDGE = ("adapters/",)

#: Other modules allowed a fixed number of uses, and why; a count only goes down.
ALLOWED: dict[str, tuple[int, str]] = {}


def any_uses(source: str) -> int:
    """How many times `Any` is imported or used in `source` (string annotations included)."""
    tree = ast.parse(source)
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in {"typing", "typing_extensions"}:
            count += sum(1 for alias in node.names if alias.name == "Any")
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            if isinstance(node.value, ast.Name) and node.value.id in {"typing", "typing_extensions", "t"}:
                count += 1
        elif isinstance(node, ast.Name) and node.id == "Any":
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
            try:
                inner = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            count += sum(1 for n in ast.walk(inner) if isinstance(n, ast.Name) and n.id == "Any")
    return count


def scan(root: Path) -> Counter[str]:
    """`Any` uses per module under `root`, outside the edge, keyed by relative path."""
    found: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EDGE):
            continue
        n = any_uses(path.read_text(encoding="utf-8"))
        if n:
            found[rel] = n
    return found


def violations(found: Counter[str], allowed: dict[str, tuple[int, str]]) -> list[str]:
    out = []
    for rel, n in sorted(found.items()):
        limit = allowed.get(rel, (0, ""))[0]
        if n > limit:
            out.append(f"{rel}: {n} uses of Any (allowed {limit})")
    return out


class TestAnyStaysAtTheEdge:
    def test_no_module_outside_the_adapters_uses_any_beyond_its_allowance(self) -> None:
        assert violations(scan(PACKAGE_DIR), ALLOWED) == []

    def test_every_allowance_is_still_needed_and_says_why(self) -> None:
        found = scan(PACKAGE_DIR)
        for rel, (limit, why) in ALLOWED.items():
            assert why.strip(), f"{rel}: an allowance needs its reason"
            assert found[rel] == limit, f"{rel}: {found[rel]} uses now, allowance {limit}: lower it"

    def test_the_scan_sees_the_package(self) -> None:
        assert len(list(PACKAGE_DIR.rglob("*.py"))) > 100


class TestTheCheckerCatchesPlantedViolations:
    @pytest.mark.parametrize(
        "source",
        [
            "from typing import Any\n",
            "import typing\nx: typing.Any = 1\n",
            "def f(x: 'dict[str, Any]') -> None: ...\n",
            "from typing import Any as A\n",
            "import typing_extensions\ny: typing_extensions.Any\n",
        ],
    )
    def test_it_counts_each_spelling(self, source: str) -> None:
        assert any_uses(source) >= 1

    def test_it_does_not_count_other_words(self) -> None:
        assert (
            any_uses("Anything = 1\nmany = 'Any time'\ndef any_(x: object) -> bool: return any([x])\n") == 0
        )

    def test_a_planted_module_outside_the_edge_is_reported(self, tmp_path: Path) -> None:
        (tmp_path / "engine").mkdir()
        (tmp_path / "adapters").mkdir()
        (tmp_path / "engine" / "bad.py").write_text("from typing import Any\nx: Any = 1\n")
        (tmp_path / "adapters" / "edge.py").write_text("from typing import Any\nx: Any = 1\n")
        found = scan(tmp_path)
        assert violations(found, {}) == ["engine/bad.py: 2 uses of Any (allowed 0)"]
        assert violations(found, {"engine/bad.py": (2, "planted")}) == []
