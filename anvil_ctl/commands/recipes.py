"""`anvilctl recipes list|show|validate|plan`: library functions that return values, never print.

`plan` builds the exact container spec `load` would create and touches nothing:
no Docker, no GPU, no database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anvil_ctl.config import HostConfig
from anvil_ctl.core.errors import RecipeError
from anvil_ctl.core.model import config_fingerprint
from anvil_ctl.core.validate import check_text
from anvil_ctl.recipes import (
    Recipe,
    check_fits_slot,
    container_spec,
    load_recipe,
    recipe_digest,
    resolve_gpu_uuids,
    spec_as_dict,
)

PLAN_TX_ID = "planned"


@dataclass(frozen=True)
class RecipeSummary:
    """One line of `recipes list`: a valid recipe's headline, or why the file is invalid."""

    name: str
    path: str
    valid: bool
    error: str | None = None
    engine: str | None = None
    served_model: str | None = None
    context_tokens: int | None = None
    max_concurrency: int | None = None
    tp_size: int | None = None
    image: str | None = None
    digest: str | None = None
    runnable: bool = False
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecipeView:
    """`recipes show`: the validated recipe as data, its digest and file."""

    name: str
    path: str
    digest: str
    runnable: bool
    recipe: dict[str, Any] = field(default_factory=dict)


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
    spec: dict[str, Any]


def resolve_recipe_path(ref: str | Path, recipes_dir: Path) -> Path:
    """A recipe by name (`recipes_dir/NAME.toml`) or by path; RecipeError when neither exists."""
    try:
        check_text(str(ref), max_len=4096, empty=False)
    except ValueError as exc:
        raise RecipeError(f"recipe {str(ref)[:80]!r}: {exc}", recipe=str(ref)[:80]) from None
    candidate = Path(ref)
    try:
        if candidate.suffix == ".toml" or candidate.exists():
            return candidate  # load_recipe names what is wrong with it (missing, a directory ...)
        by_name = recipes_dir / f"{ref}.toml"
        if by_name.exists() or by_name.is_symlink():  # a broken link or loop: load_recipe names it
            return by_name
        known = sorted(p.stem for p in recipes_dir.glob("*.toml")) if recipes_dir.is_dir() else []
    except OSError as exc:  # a name too long for the file system, a loop in the path
        raise RecipeError(f"recipe {str(ref)[:80]!r}: {exc.strerror}", recipe=str(ref)[:80]) from None
    raise RecipeError(
        f"recipe {str(ref)!r} not found in {recipes_dir}; expected one of {known}",
        recipe=str(ref),
    )


def list_recipes(recipes_dir: Path) -> list[RecipeSummary]:
    """Every `*.toml` in the directory by name; invalid files are listed with their error."""
    if not recipes_dir.is_dir():
        raise RecipeError(f"{recipes_dir}: recipes directory not found", file=str(recipes_dir))
    out = []
    for path in sorted(recipes_dir.glob("*.toml")):
        try:
            recipe = load_recipe(path)
        except RecipeError as exc:
            out.append(RecipeSummary(name=path.stem, path=str(path), valid=False, error=str(exc)))
            continue
        out.append(
            RecipeSummary(
                name=recipe.name,
                path=str(path),
                valid=True,
                engine=recipe.engine,
                served_model=recipe.served_model,
                context_tokens=recipe.context_tokens,
                max_concurrency=recipe.max_concurrency,
                tp_size=recipe.tp_size,
                image=recipe.image,
                digest=recipe_digest(recipe),
                runnable=recipe.runnable,
                unknown=recipe.unknown,
            )
        )
    return out


def show_recipe(ref: str | Path, recipes_dir: Path) -> RecipeView:
    path = resolve_recipe_path(ref, recipes_dir)
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
    recipes_dir: Path,
    *,
    host_config: HostConfig | None = None,
    slot_name: str | None = None,
) -> ValidationReport:
    """Validate the file; with a host config and slot also check it fits (port, GPU roles)."""
    path = resolve_recipe_path(ref, recipes_dir)
    recipe = load_recipe(path)
    if host_config is not None and slot_name is not None:
        _check_host(recipe, host_config, slot_name)
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
    recipes_dir: Path,
    *,
    host_config: HostConfig,
    slot_name: str,
    tx_id: str = PLAN_TX_ID,
) -> Plan:
    """The exact ContainerSpec `load` would create (as a dict); nothing is touched."""
    path = resolve_recipe_path(ref, recipes_dir)
    recipe = load_recipe(path)
    slot = host_config.slot(slot_name)
    spec = container_spec(
        recipe,
        slot_name=slot_name,
        slot=slot,
        host_config=host_config,
        recipe_path=path,
        tx_id=tx_id,
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


def _check_host(recipe: Recipe, host_config: HostConfig, slot_name: str) -> None:
    slot = host_config.slot(slot_name)
    check_fits_slot(recipe, slot)
    resolve_gpu_uuids(recipe, host_config)
