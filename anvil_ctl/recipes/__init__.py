"""Recipes: pinned, validated descriptions of one serve, and the container spec `load` creates.

A recipe is a TOML file in `recipes/` whose file name (without `.toml`) is its
`name`. It pins the model (`repo@<40-hex revision>`) and the image (repo digest
or local image ID; a tag is refused), and names everything the container needs.
Values the sources of a recipe do not give are never invented: they stay absent
and are listed in `unknown`; values we chose ourselves are listed in `assumed`.
A recipe with any `unknown` entry validates and plans but is not runnable.

Warning: the recipe digest covers the file's content, not its location; relative
mount sources resolve against the recipe's directory only when a spec is made.

This package re-exports its modules' public names: `model` (the recipe, its
loading and digest) and `spec` (the container spec and the checks before it).
"""

from anvil_ctl.recipes.model import (
    COMMIT_RE,
    ENGINES_WITHOUT_MODEL,
    IMAGE_DIGEST_RE,
    IMAGE_ID_RE,
    LIMIT,
    MODEL_IDENTITY_RE,
    SHM_SIZE_RE,
    Arg,
    ExternalPrior,
    Line,
    Recipe,
    RecipeModelFile,
    RecipeMount,
    RecipeSource,
    Ulimit,
    load_recipe,
    recipe_digest,
)
from anvil_ctl.recipes.spec import (
    check_fits_slot,
    check_runnable,
    container_name,
    container_spec,
    model_cache_mount,
    resolve_gpu_uuids,
    short_tx,
    spec_as_dict,
)

__all__ = [
    "COMMIT_RE",
    "ENGINES_WITHOUT_MODEL",
    "IMAGE_DIGEST_RE",
    "IMAGE_ID_RE",
    "LIMIT",
    "MODEL_IDENTITY_RE",
    "SHM_SIZE_RE",
    "Arg",
    "ExternalPrior",
    "Line",
    "Recipe",
    "RecipeModelFile",
    "RecipeMount",
    "RecipeSource",
    "Ulimit",
    "check_fits_slot",
    "check_runnable",
    "container_name",
    "container_spec",
    "load_recipe",
    "model_cache_mount",
    "recipe_digest",
    "resolve_gpu_uuids",
    "short_tx",
    "spec_as_dict",
]
