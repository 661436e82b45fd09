"""Dependencies point inward, and one table says exactly how far.

`cli -> commands -> engine -> core`; adapters and persistence implement the
core's ports; SQL lives in persistence only; a foreign SDK stays behind its
adapter; nobody but the composition root (`anvil_ctl.bootstrap`) reaches the
shipped fakes in `anvil_ctl.testing`. The table below is the whole rule set:
`LAYERS` says which modules make up each layer, `MAY_IMPORT` which other
layers each one may import, `ONLY_IN` where each restricted library (or
persistence-private module) may be imported. No module imports itself back through
others: the tree's import graph has no cycle (no strongly connected set of modules).

The scan is static: every module of `anvil_ctl/` and `migrations/` is parsed
with `ast`, and every `import` / `from` statement counts wherever it stands
(module level, inside a function, under `TYPE_CHECKING`), relative imports
resolved, plus `importlib.import_module("...")` / `__import__("...")` with a
literal name. Each rule is one parametrized case, and each has a twin that
plants a violation in a synthetic module and shows the checker reports it.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

import anvil_ctl

PACKAGE_DIR = Path(anvil_ctl.__file__).parent
REPO = PACKAGE_DIR.parent


def _package(name: str) -> tuple[str, ...]:
    return (f"anvil_ctl.{name}", f"anvil_ctl.{name}.*")


# -- the table ---------------------------------------------------------------------------------

# Which modules make up each layer (fnmatch patterns over dotted module names).
LAYERS: dict[str, tuple[str, ...]] = {
    "package": ("anvil_ctl",),
    "core": _package("core"),
    "config": _package("config"),
    "atomic": ("anvil_ctl.atomic",),
    "places": ("anvil_ctl.places",),
    "log": ("anvil_ctl.log",),
    "persistence": _package("persistence"),
    "adapters": _package("adapters"),
    "gpu": _package("gpu"),
    "qualify": _package("qualify"),
    "evidence": _package("evidence"),
    "recipes": _package("recipes"),
    "acceptance": ("anvil_ctl.acceptance", "anvil_ctl.acceptance_worker"),
    "engine": _package("engine"),
    "commands": _package("commands"),
    "bootstrap": _package("bootstrap"),
    "cli": ("anvil_ctl.cli", "anvil_ctl.cli.*", "anvil_ctl.__main__"),
    "testing": _package("testing"),
    "migrations": ("migrations", "migrations.*"),
}

# The core, the configuration and the domain packages (GPU policy, qualification, its
# evidence, recipes).
_BASE = frozenset({"core", "config", "gpu", "qualify", "evidence", "recipes"})

# Which other layers each layer may import; anything not listed is off limits. Only
# `bootstrap`, the composition root, may import `testing`.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "package": frozenset(),
    "core": frozenset(),
    "config": frozenset({"core", "places"}),
    "atomic": frozenset(),
    # places: where anvilctl's files are (the shipped migrations and recipes, the default
    # state directory and host config); it imports nothing, and whoever needs a place asks it.
    "places": frozenset(),
    # log: structlog behind `get_logger`, loaded at the first line that passes the level; it
    # imports no layer, and every layer that logs takes its logger there
    "log": frozenset(),
    # atomic: the audit chain's head file beside the database is replaced atomically.
    "persistence": frozenset({"core", "config", "atomic", "places", "log"}),
    "adapters": frozenset({"core", "config", "atomic", "log"}),
    "gpu": frozenset({"core", "config", "log"}),
    # qualify writes its evidence; evidence reads bundles and never runs a qualification
    "qualify": frozenset({"core", "config", "atomic", "log", "evidence"}),
    "evidence": frozenset({"core", "config", "atomic", "log"}),
    # recipes: the shipped recipes' relative mounts resolve beside the installed package
    "recipes": frozenset({"core", "config", "places"}),
    "acceptance": frozenset({"core", "config", "adapters", "log"}),
    "engine": _BASE | {"persistence", "log"},
    "commands": _BASE
    | {"persistence", "adapters", "acceptance", "engine", "bootstrap", "atomic", "places", "log"},
    "bootstrap": frozenset(LAYERS) - {"bootstrap", "cli", "migrations"},
    # cli renders the engine's result types; its completion finds recipes and the default config
    "cli": _BASE | {"log", "commands", "bootstrap", "engine", "places"},
    "testing": _BASE | {"log"},
    "migrations": frozenset({"core", "persistence"}),
}

_ALL_BUT_CORE = frozenset(LAYERS) - {"core"}

# Where each restricted library or private module may be imported: layers, or single modules.
ONLY_IN: dict[str, frozenset[str]] = {
    # SQL lives in persistence and in the alembic migrations that build its schema.
    "sqlalchemy": frozenset({"persistence", "migrations"}),
    "alembic": frozenset({"persistence", "migrations"}),
    # ORM rows, DDL and the audit chain's session-level code never leave persistence.
    "anvil_ctl.persistence.models": frozenset({"persistence", "migrations"}),
    "anvil_ctl.persistence.ddl": frozenset({"persistence", "migrations"}),
    "anvil_ctl.persistence.current_models": frozenset({"persistence", "migrations"}),
    "anvil_ctl.persistence.audit": frozenset({"persistence"}),
    # Foreign SDKs stay behind their adapter.
    "docker": frozenset({"adapters"}),
    "pynvml": frozenset({"anvil_ctl.adapters.nvml"}),
    # I/O of any kind: anywhere but the sans-I/O core.
    "httpx": _ALL_BUT_CORE,
    "requests": _ALL_BUT_CORE,
    "openai": _ALL_BUT_CORE,
    "subprocess": _ALL_BUT_CORE,
    "socket": _ALL_BUT_CORE,
}

# (importing module, imported module or prefix): violations allowed for now, each with its
# reason. Empty: the bootstrap builds the fakes, so no command imports them.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


# -- the checker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    module: str
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.module} imports {self.imported} (rule {self.rule})"


def layer_rule(layer: str) -> str:
    return f"layer:{layer}"


def library_rule(name: str) -> str:
    return f"only-in:{name}"


def layer_of(module: str) -> str | None:
    for layer, patterns in LAYERS.items():
        if any(fnmatchcase(module, p) for p in patterns):
            return layer
    return None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _dynamic_import(func: ast.expr) -> bool:
    """importlib.import_module(...), import_module(...) or __import__(...)."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def imported_names(source: str, module: str, *, is_package: bool, known: Collection[str]) -> set[str]:
    """Every module name `source` imports; `from a import b` counts as `a.b` when that is a module."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in known else base)
        elif (
            isinstance(node, ast.Call)
            and _dynamic_import(node.func)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def check(module: str, names: Iterable[str]) -> list[Violation]:
    """The violations of the table by `module` importing `names`."""
    layer = layer_of(module)
    found = []
    for name in sorted(names):
        target = layer_of(name)
        if layer is not None and target is not None and target != layer and target not in MAY_IMPORT[layer]:
            found.append(Violation(module, name, layer_rule(layer)))
        for restricted, places in ONLY_IN.items():
            if _within(name, restricted) and not any(
                place == layer or _within(module, place) for place in places
            ):
                found.append(Violation(module, name, library_rule(restricted)))
    return found


def check_source(module: str, source: str, *, is_package: bool = False) -> list[Violation]:
    """Check a synthetic module as if it were part of the tree."""
    known = set(_scan()) | {module}
    return check(module, imported_names(source, module, is_package=is_package, known=known))


@dataclass(frozen=True)
class Source:
    path: Path
    is_package: bool


def _sources() -> dict[str, Source]:
    out = {}
    for base, folder in ((REPO, PACKAGE_DIR), (REPO, REPO / "migrations")):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = Source(path, is_package)
    return out


@functools.cache
def _scan() -> dict[str, frozenset[str]]:
    """module -> names it imports, over the whole tree."""
    sources = _sources()
    return {
        module: frozenset(
            imported_names(src.path.read_text(), module, is_package=src.is_package, known=sources)
        )
        for module, src in sources.items()
    }


@functools.cache
def tree_violations() -> tuple[Violation, ...]:
    return tuple(v for module, names in sorted(_scan().items()) for v in check(module, names))


def _runs(module: str, imported: Collection[str]) -> set[str]:
    """What importing `imported` from `module` executes: each name and every package above it
    (`import a.b.c` runs `a/__init__` and `a/b/__init__` first), except the packages `module`
    itself sits in, which are already running when it imports."""
    own = {module.rsplit(".", n)[0] for n in range(module.count(".") + 1)}
    parts = (name.split(".") for name in imported)
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)} - (own - set(imported))


def import_cycles(graph: Mapping[str, Collection[str]]) -> list[tuple[str, ...]]:
    """Every import cycle of `graph` (module -> what it imports, parent packages included:
    `_runs`): each strongly connected set of two or more modules, or a module importing itself,
    sorted (Tarjan's algorithm)."""
    graph = {module: _runs(module, imported) for module, imported in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[tuple[str, ...]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(t for t in graph.get(module, ()) if t in graph):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(members) > 1 or module in graph[module]:
                cycles.append(tuple(sorted(members)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def cycles_with(module: str, source: str) -> list[tuple[str, ...]]:
    """The tree's import cycles if `module` (of the tree or new) had `source` as its text."""
    graph = dict(_scan())
    graph[module] = frozenset(imported_names(source, module, is_package=False, known={*graph, module}))
    return import_cycles(graph)


def _known(v: Violation) -> bool:
    return any(v.module == module and _within(v.imported, prefix) for module, prefix in KNOWN_VIOLATIONS)


def _representative(layer: str) -> str:
    """A module name of the layer, for planting."""
    return next(p for p in LAYERS[layer] if "*" not in p)


# -- the rules, one case each ------------------------------------------------------------------


class TestTheTree:
    @pytest.mark.parametrize("layer", sorted(LAYERS))
    def test_a_layer_imports_only_the_layers_the_table_allows(self, layer: str) -> None:
        found = [str(v) for v in tree_violations() if v.rule == layer_rule(layer) and not _known(v)]
        assert not found, "\n".join(found)

    @pytest.mark.parametrize("name", sorted(ONLY_IN))
    def test_a_restricted_module_is_imported_only_where_the_table_allows(self, name: str) -> None:
        found = [str(v) for v in tree_violations() if v.rule == library_rule(name) and not _known(v)]
        assert not found, "\n".join(found)

    def test_every_known_violation_still_occurs(self) -> None:
        found = tree_violations()
        stale = [
            entry
            for entry in sorted(KNOWN_VIOLATIONS)
            if not any(v.module == entry[0] and _within(v.imported, entry[1]) for v in found)
        ]
        assert stale == [], f"{stale} no longer occur: delete them from KNOWN_VIOLATIONS"

    def test_no_module_imports_itself_back_through_others(self) -> None:
        cycles = import_cycles(_scan())
        assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)

    def test_every_module_belongs_to_a_layer(self) -> None:
        assert [m for m in _scan() if layer_of(m) is None] == []

    def test_the_scan_sees_the_tree(self) -> None:
        layers = {layer_of(m) for m in _scan()}
        assert len([m for m in _scan() if layer_of(m) == "core"]) >= 6
        assert layers >= set(LAYERS)

    def test_the_stub_engine_imports_only_the_standard_library_and_itself(self) -> None:
        # It runs in containers whose only Python is the host's, with `anvil_stub` alone mounted.
        stub = REPO / "anvil_stub"
        found = {
            f"{path.name}: {name}"
            for path in sorted(stub.rglob("*.py"))
            for name in imported_names(
                path.read_text(), f"anvil_stub.{path.stem}", is_package=path.stem == "__init__", known=()
            )
            if name.split(".")[0] not in (*sys.stdlib_module_names, "anvil_stub")
        }
        assert len(list(stub.rglob("*.py"))) >= 5
        assert found == set()

    def test_the_table_names_only_layers_it_defines(self) -> None:
        assert set(MAY_IMPORT) == set(LAYERS)
        named = set().union(*MAY_IMPORT.values(), *ONLY_IN.values())
        assert {n for n in named if "." not in n} <= set(LAYERS)
        assert {n for n in named if "." in n} <= set(_scan())


# -- the checker catches what each rule forbids ------------------------------------------------


def _forbidden_layer(layer: str) -> str:
    return next(t for t in sorted(LAYERS) if t != layer and t not in MAY_IMPORT[layer])


def _forbidden_place(name: str) -> str:
    places = ONLY_IN[name]
    return next(
        _representative(layer)
        for layer in sorted(LAYERS)
        if not any(p == layer or _within(_representative(layer), p) for p in places)
    )


class TestTheChecker:
    @pytest.mark.parametrize("layer", sorted(LAYERS))
    def test_it_reports_a_planted_import_of_a_forbidden_layer(self, layer: str) -> None:
        module, target = _representative(layer), _representative(_forbidden_layer(layer))
        allowed = sorted(MAY_IMPORT[layer] - {"package"})
        source = "".join(f"import {_representative(a)}\n" for a in allowed[:1])
        source += f"def later():\n    from {target} import anything\n"
        found = [v for v in check_source(module, source) if v.rule == layer_rule(layer)]
        assert [(v.module, v.imported) for v in found] == [(module, target)]

    @pytest.mark.parametrize("name", sorted(ONLY_IN))
    def test_it_reports_a_planted_import_of_a_restricted_module(self, name: str) -> None:
        module = _forbidden_place(name)
        found = check_source(module, f"from {name} import anything\n")
        assert (module, name) in [(v.module, v.imported) for v in found if v.rule == library_rule(name)]

    @pytest.mark.parametrize("name", sorted(ONLY_IN))
    def test_a_restricted_module_passes_where_it_is_allowed(self, name: str) -> None:
        place = sorted(ONLY_IN[name])[0]
        module = _representative(place) if place in LAYERS else place
        assert [v for v in check_source(module, f"import {name}\n") if v.rule == library_rule(name)] == []

    def test_it_resolves_relative_imports(self) -> None:
        found = check_source("anvil_ctl.engine.lock", "from ..persistence import models\n")
        assert [v.imported for v in found] == ["anvil_ctl.persistence.models"]

    def test_it_sees_imports_under_type_checking(self) -> None:
        source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from anvil_ctl.cli import main\n"
        assert [v.imported for v in check_source("anvil_ctl.commands.audit", source)] == ["anvil_ctl.cli"]

    def test_it_sees_dynamic_imports_of_a_literal_name(self) -> None:
        source = 'import importlib\nnvml = importlib.import_module("pynvml")\nd = __import__("docker")\n'
        found = check_source("anvil_ctl.adapters.smg", source)
        assert sorted(v.imported for v in found) == ["pynvml"]
        assert sorted(v.imported for v in check_source("anvil_ctl.engine.x", source)) == ["docker", "pynvml"]

    def test_from_package_import_module_counts_as_the_module(self) -> None:
        found = check_source("anvil_ctl.cli.audit", "from anvil_ctl import testing\n")
        assert [v.imported for v in found] == ["anvil_ctl.testing"]

    def test_a_known_violation_masks_only_its_own_import(self, monkeypatch: pytest.MonkeyPatch) -> None:
        module, prefix = "anvil_ctl.commands.gpus_and_waivers", "anvil_ctl.testing"
        monkeypatch.setitem(globals(), "KNOWN_VIOLATIONS", frozenset({(module, prefix)}))
        planted = check_source(module, f"import {prefix}\nimport anvil_ctl.cli\n")
        assert [v.imported for v in planted if not _known(v)] == ["anvil_ctl.cli"]


class TestTheCycleFinder:
    def test_it_finds_each_strongly_connected_set_once(self) -> None:
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
        assert import_cycles(graph) == [("a", "b", "c"), ("d", "e")]

    def test_a_module_importing_itself_is_a_cycle_and_a_chain_is_not(self) -> None:
        assert import_cycles({"a": {"a"}, "b": {"c"}, "c": set()}) == [("a",)]

    def test_it_finds_a_cycle_planted_in_the_tree_through_an_import_inside_a_function(self) -> None:
        # cli.app reaches places (the default paths); places importing cli.app back closes a circle
        planted = cycles_with("anvil_ctl.places", "def later():\n    from anvil_ctl.cli import app\n")
        assert [c for c in planted if "anvil_ctl.places" in c]
        assert "anvil_ctl.cli.app" in next(c for c in planted if "anvil_ctl.places" in c)

    def test_it_finds_a_cycle_through_a_package_init_that_imports_its_modules(self) -> None:
        # `engine.plans.args` is imported after `engine/plans/__init__`, which imports every plan,
        # and the plans import `engine.guards`: guards importing args would fail at import time.
        planted = cycles_with("anvil_ctl.engine.guards", "from anvil_ctl.engine.plans.args import LoadArgs\n")
        assert any({"anvil_ctl.engine.guards", "anvil_ctl.engine.plans"} <= set(c) for c in planted), planted

    def test_a_module_importing_a_sibling_does_not_cycle_through_its_own_package(self) -> None:
        assert import_cycles({"p": {"p.a"}, "p.a": {"p.b"}, "p.b": set()}) == []
        assert import_cycles({"p": {"p.a"}, "p.a": set(), "q": {"p.a"}}) == []

    def test_an_import_only_one_way_closes_no_cycle(self) -> None:
        assert cycles_with("anvil_ctl.cli.extra", "from anvil_ctl.cli import app\n") == import_cycles(_scan())
