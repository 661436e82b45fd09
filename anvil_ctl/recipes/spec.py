"""The container spec `load` creates for a recipe in a slot, and the checks before it. Pure."""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path

from anvil_ctl.config.host import HostConfig, Slot
from anvil_ctl.core.errors import RecipeError
from anvil_ctl.core.jsontypes import JSONObject, plain
from anvil_ctl.core.model import (
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_RECIPE_DIGEST,
    LABEL_ROLE,
    LABEL_SERVED_MODEL,
    LABEL_SLOT,
    LABEL_TX,
    ContainerSpec,
    Mount,
    hub_repo_folder,
)
from anvil_ctl.places import recipe_base
from anvil_ctl.recipes.model import Recipe, recipe_digest


def check_runnable(recipe: Recipe) -> None:
    """Refuse (RecipeError) a recipe that lists values its sources do not give."""
    if recipe.unknown:
        raise RecipeError(
            f"recipe {recipe.name}: unknown: {', '.join(recipe.unknown)} not given by its sources; "
            "expected every value known before it can run",
            field="unknown",
        )


def check_fits_slot(recipe: Recipe, slot: Slot) -> None:
    """The recipe listens on the slot's port and uses only GPU roles the slot allows."""
    if recipe.port != slot.port:
        raise RecipeError(
            f"recipe {recipe.name}: port: {recipe.port} differs from the slot binding "
            f"{slot.binding}; expected {slot.port}",
            field="port",
        )
    if slot.gpu_roles:
        foreign = [r for r in recipe.gpu_roles if r not in slot.gpu_roles]
        if foreign:
            raise RecipeError(
                f"recipe {recipe.name}: gpu_roles: {foreign} are not allowed in this slot; "
                f"expected roles among {list(slot.gpu_roles)}",
                field="gpu_roles",
            )


def resolve_gpu_uuids(recipe: Recipe, host_config: HostConfig) -> tuple[str, ...]:
    """GPU UUIDs of the recipe's roles, in role order (never indexes)."""
    uuids = []
    for role in recipe.gpu_roles:
        gpu = host_config.gpu_roles.get(role)
        if gpu is None:
            raise RecipeError(
                f"recipe {recipe.name}: gpu_roles: role {role!r} is not in the host config; "
                f"expected one of {sorted(host_config.gpu_roles)}",
                field="gpu_roles",
            )
        uuids.append(gpu.uuid)
    return tuple(uuids)


def short_tx(tx_id: str) -> str:
    """The first eight alphanumerics of a transaction ID, lower case."""
    short = re.sub(r"[^a-z0-9]", "", tx_id.lower())[:8]
    if not short:
        raise ValueError(f"transaction id {tx_id!r} has no letters or digits")
    return short


def container_spec(
    recipe: Recipe,
    *,
    slot_name: str,
    slot: Slot,
    host_config: HostConfig,
    recipe_path: Path,
    tx_id: str | None = None,
) -> ContainerSpec:
    """Exactly the container `load` creates for this recipe in this slot; without `tx_id` the spec
    names no transaction yet (`load` labels it and suffixes its name when creating it)."""
    check_fits_slot(recipe, slot)
    labels = {
        LABEL_MANAGED: "true",
        LABEL_SLOT: slot_name,
        LABEL_RECIPE: recipe.name,
        LABEL_RECIPE_DIGEST: recipe_digest(recipe),
        LABEL_ROLE: "candidate",
    }
    if tx_id is not None:
        labels[LABEL_TX] = tx_id
    if recipe.served_model is not None:
        labels[LABEL_SERVED_MODEL] = recipe.served_model
    base = recipe_base(recipe_path.parent.absolute())  # an absolute source stands as given (os.path.join)
    mounts = [
        Mount(os.path.normpath(os.path.join(base, m.source)), m.target, m.read_only) for m in recipe.mounts
    ]
    if recipe.model_mount is not None and recipe.model_repo is not None:  # a recipe's check pairs them
        # The model's repository folder in the host's cache, read-only at `model_mount`.
        if host_config.model_cache_dir is None:
            raise RecipeError(
                f"recipe {recipe.name}: model_mount: the host config sets no model_cache_dir to mount "
                "the model from; expected model_cache_dir in anvil.toml",
                field="model_mount",
            )
        cache = host_config.model_cache_dir.absolute()
        mounts.append(
            Mount(os.path.normpath(cache / hub_repo_folder(recipe.model_repo)), recipe.model_mount, True)
        )
    name = f"anvil-{slot_name}-{recipe.name}"
    return ContainerSpec(
        name=f"{name}-{short_tx(tx_id)}" if tx_id else name,
        image=recipe.image,
        command=recipe.args,
        entrypoint=recipe.entrypoint,
        env=tuple(sorted(recipe.env.items())),
        labels=tuple(sorted(labels.items())),
        mounts=tuple(mounts),
        network_mode="host",
        gpu_uuids=resolve_gpu_uuids(recipe, host_config),
        shm_size=recipe.shm_size,
        ipc_mode=recipe.ipc_mode,
        ulimits=recipe.ulimit_tuples(),
        init=True,
    )


def spec_as_dict(spec: ContainerSpec) -> JSONObject:
    """A ContainerSpec as plain JSON-able data (tuples as lists)."""
    data = {**asdict(spec), "env": dict(spec.env), "labels": dict(spec.labels)}
    return {k: plain(v) for k, v in data.items()}
