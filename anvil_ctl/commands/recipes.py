"""`anvilctl recipes list|show|validate|plan`: library functions that return values, never print;
`plan` builds the container spec `load` would create and touches nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from anvil_ctl.bootstrap import App
from anvil_ctl.config.host import HostConfig
from anvil_ctl.core.errors import RecipeError
from anvil_ctl.core.jsontypes import JSONObject, get_array
from anvil_ctl.core.model import config_fingerprint
from anvil_ctl.core.validate import check_text
from anvil_ctl.places import RECIPES_DIR
from anvil_ctl.recipes.model import load_recipe, recipe_digest
from anvil_ctl.recipes.spec import check_fits_slot, container_spec, resolve_gpu_uuids, spec_as_dict


@dataclass(frozen=True)
class RecipeView:
    """`recipes show`: the validated recipe as data, its digest and file."""

    name: str
    path: str
    digest: str
    runnable: bool
    recipe: JSONObject = field(default_factory=dict)  # the validated recipe, as JSON


@dataclass(frozen=True)
class ValidationReport:
    """`recipes validate`: a recipe that passed, and the optional slot checks that ran."""

    name: str
    path: str
    digest: str
    runnable: bool
    unknown: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()
    checked_slot: str | None = None


@dataclass(frozen=True)
class Plan:
    """`recipes plan`: the exact container spec `load` would create, and what is unknown."""

    recipe: str
    path: str
    slot: str
    digest: str
    runnable: bool
    unknown: tuple[str, ...]
    config_fingerprint: str
    spec: Mapping[str, object]  # `recipes.spec_as_dict`: the ContainerSpec as JSON-able data


@dataclass(frozen=True)
class RecipeDir:
    """One directory of the recipe search, and why it is searched."""

    path: Path
    source: str
    """`--recipes-dir`, `ANVIL_RECIPES_DIR`, `host config` or `shipped`."""


def recipe_search(app: App) -> list[RecipeDir]:
    """This command's recipe search, first match wins: `--recipes-dir` or ANVIL_RECIPES_DIR, the
    host config's `recipes_dir`, then the recipes shipped with anvilctl. A directory someone
    named must exist."""
    dirs = []
    if app.settings.recipes_dir is not None:
        dirs.append(RecipeDir(app.settings.recipes_dir, app.origins.get("recipes_dir", "ANVIL_RECIPES_DIR")))
    host_config = app.optional_config()
    if host_config is not None and host_config.recipes_dir is not None:
        dirs.append(RecipeDir(host_config.recipes_dir, "host config"))
    for d in dirs:
        if not d.path.is_dir():
            raise RecipeError(
                f"{d.path}: recipes directory not found (named by {d.source})", file=str(d.path)
            )
    return [*dirs, RecipeDir(RECIPES_DIR, "shipped")]


def resolve_recipe_path(ref: str | Path, recipes: Sequence[RecipeDir]) -> Path:
    """A recipe by name (`DIR/NAME.toml`, the first directory of the search that has it) or by
    path; RecipeError when neither exists."""
    try:
        check_text(str(ref), max_len=4096, empty=False)
    except ValueError as exc:
        raise RecipeError(f"recipe {str(ref)[:80]!r}: {exc}", recipe=str(ref)[:80]) from None
    candidate = Path(ref)
    try:
        if candidate.suffix == ".toml" or candidate.exists():
            return candidate  # load_recipe names what is wrong with it (missing, a directory ...)
        for d in recipes:
            by_name = d.path / f"{ref}.toml"
            if by_name.exists() or by_name.is_symlink():  # a broken link or loop: load_recipe names it
                return by_name
        known = sorted({p.stem for d in recipes if d.path.is_dir() for p in d.path.glob("*.toml")})
    except OSError as exc:  # a name too long for the file system, a loop in the path
        raise RecipeError(f"recipe {str(ref)[:80]!r}: {exc.strerror}", recipe=str(ref)[:80]) from None
    where = ", ".join(f"{d.path} ({d.source})" for d in recipes)
    raise RecipeError(
        f"recipe {str(ref)!r} not found in {where}; expected one of {known}",
        recipe=str(ref),
    )


def list_recipes(recipes: Sequence[RecipeDir]) -> list[JSONObject]:
    """Every `*.toml` of the search by name, with the directory it came from (`source`); a name
    found again further down the search is hidden by the first (`shadows` names the files it
    hides). An invalid file is listed with its `error`."""
    if not any(d.path.is_dir() for d in recipes):
        raise RecipeError(f"{recipes[0].path}: recipes directory not found", file=str(recipes[0].path))
    out: dict[str, JSONObject] = {}
    for d in recipes:
        for path in sorted(d.path.glob("*.toml")) if d.path.is_dir() else []:
            if path.stem in out:
                out[path.stem]["shadows"] = [*get_array(out[path.stem], "shadows"), str(path)]
            else:
                out[path.stem] = {"name": path.stem, "path": str(path), "source": d.source, "shadows": []}
                out[path.stem].update(_summary(path))
    return list(out.values())


def _summary(path: Path) -> JSONObject:
    """A valid recipe's headline, or why the file is invalid."""
    try:
        recipe = load_recipe(path)
    except RecipeError as exc:
        return {"valid": False, "error": str(exc), "runnable": False}
    return {
        "valid": True,
        "error": None,
        "engine": recipe.engine,
        "served_model": recipe.served_model,
        "context_tokens": recipe.context_tokens,
        "max_concurrency": recipe.max_concurrency,
        "tp_size": recipe.tp_size,
        "image": recipe.image,
        "digest": recipe_digest(recipe),
        "runnable": recipe.runnable,
        "unknown": list(recipe.unknown),
    }


def show_recipe(ref: str | Path, recipes: Sequence[RecipeDir]) -> RecipeView:
    path = resolve_recipe_path(ref, recipes)
    recipe = load_recipe(path)
    return RecipeView(
        name=recipe.name,
        path=str(path),
        digest=recipe_digest(recipe),
        runnable=recipe.runnable,
        recipe=recipe.model_dump(mode="json"),
    )


def validate_recipe(
    ref: str | Path,
    recipes: Sequence[RecipeDir],
    *,
    host_config: HostConfig | None = None,
    slot_name: str | None = None,
) -> ValidationReport:
    """Validate the file; with a host config and slot also check it fits (port, GPU roles)."""
    path = resolve_recipe_path(ref, recipes)
    recipe = load_recipe(path)
    if host_config is not None and slot_name is not None:
        check_fits_slot(recipe, host_config.slot(slot_name))
        resolve_gpu_uuids(recipe, host_config)
    return ValidationReport(
        name=recipe.name,
        path=str(path),
        digest=recipe_digest(recipe),
        runnable=recipe.runnable,
        unknown=recipe.unknown,
        assumed=recipe.assumed,
        checked_slot=slot_name if host_config is not None else None,
    )


def plan_recipe(
    ref: str | Path,
    recipes: Sequence[RecipeDir],
    *,
    host_config: HostConfig,
    slot_name: str,
) -> Plan:
    """The exact ContainerSpec `load` would create (as a dict); nothing is touched."""
    path = resolve_recipe_path(ref, recipes)
    recipe = load_recipe(path)
    slot = host_config.slot(slot_name)
    spec = container_spec(
        recipe,
        slot_name=slot_name,
        slot=slot,
        host_config=host_config,
        recipe_path=path,
        tx_id="planned",
    )
    return Plan(
        recipe=recipe.name,
        path=str(path),
        slot=slot_name,
        digest=recipe_digest(recipe),
        runnable=recipe.runnable,
        unknown=recipe.unknown,
        config_fingerprint=config_fingerprint(spec.fingerprint_fields()),
        spec=spec_as_dict(spec),
    )
