"""load and unload from recipes: build the Candidate, run the transaction, remove what we made."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from anvil_ctl.commands import recipes as recipe_cmds
from anvil_ctl.commands.context import Context
from anvil_ctl.commands.transactions import load as load_tx
from anvil_ctl.core.errors import BadInput, NotFound, Refused
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.engine.runner import Outcome
from anvil_ctl.engine.serving import Candidate
from anvil_ctl.persistence import gpu_ledger
from anvil_ctl.recipes import check_runnable, container_spec, load_recipe, recipe_digest


def candidate_from_recipe(ctx: Context, ref: str, slot: str, tx_id: str) -> Candidate:
    path = recipe_cmds.resolve_recipe_path(ref, ctx.settings.recipes_dir)
    recipe = load_recipe(path)
    check_runnable(recipe)
    slot_cfg = ctx.config.slot(slot)
    spec = container_spec(
        recipe, slot_name=slot, slot=slot_cfg, host_config=ctx.config, recipe_path=path, tx_id=tx_id
    )
    # The simulated GPU probe and operators find a serve's endpoint by this label.
    spec = replace(spec, labels=(*spec.labels, ("io.anvil.binding", slot_cfg.binding)))
    if recipe.served_model is None:
        raise BadInput(f"{path}: served_model: required to load", field="served_model")
    return Candidate(
        recipe=recipe.name,
        recipe_digest=recipe_digest(recipe),
        served_model=recipe.served_model,
        context_tokens=recipe.context_tokens,
        health_path=recipe.health_path,
        startup_timeout_s=recipe.startup_timeout_s,
        spec=spec,
        gpu_roles=tuple(recipe.gpu_roles),
        model_identity=recipe.model or "",
        max_concurrency=recipe.max_concurrency or 1,
        vram_need_mib=recipe.vram_need_mib,
    )


def load(ctx: Context, ref: str, *, slot: str, dry_run: bool = False) -> Outcome:
    tx_id = str(uuid.uuid4())
    cand = candidate_from_recipe(ctx, ref, slot, tx_id)
    return load_tx(ctx, slot=slot, candidate=cand, dry_run=dry_run, tx_id=tx_id)


def unload(
    ctx: Context, container_id: str, *, yes: bool = False, remove_residue: bool = False
) -> dict[str, Any]:
    """Remove a candidate container this controller created; labels and ID checked twice."""
    world = ctx.world()

    def check() -> Any:
        try:
            info = world.runtime.inspect(container_id)
        except NotFound:
            raise BadInput(f"container {container_id}: not found", field="container_id") from None
        if not info.managed or info.labels.get(LABEL_ROLE) != "candidate":
            raise Refused(
                f"container {info.id[:12]} ({info.name}) was not created by anvilctl as a candidate; "
                "refusing to remove it",
                container_id=info.id,
            )
        for role in ("incumbent", "rollback"):
            ident = ctx.store.current_identity(info.labels.get("io.anvil.slot", ""), role)
            if ident and ident.container_id == info.id:
                raise Refused(f"container {info.id[:12]} is the slot's {role}; refusing to remove it")
        return info

    info = check()
    if not yes:
        return {"container_id": info.id, "would_remove": True, "hint": "pass --yes to remove"}
    with HostLock(ctx.store, ctx.settings.lock_path, ctx.owner, "unload"):
        info = check()  # again, under the lock, just before acting
        if info.running:
            world.runtime.stop(info.id, ctx.config.policy.stop_timeout_s)
        world.runtime.remove(info.id)
        roles = [r for r, o in gpu_ledger.gpu_owners(ctx.store).items() if o["container_id"] == info.id]
        gpu_ledger.release_roles(ctx.store, roles, container_id=info.id, tx_id=None)
        residue = [r.__dict__ for r in world.shm.residue()] if world.shm else []
        ctx.store.append_audit(
            "unload",
            info.labels.get("io.anvil.transaction"),
            {"container_id": info.id, "name": info.name, "residue": residue},
        )
    result: dict[str, Any] = {"container_id": info.id, "removed": True, "shm_residue": residue}
    if remove_residue and residue:
        from anvil_ctl.adapters.shm import ShmScanner
        from anvil_ctl.adapters.shm import remove_residue as remove

        if isinstance(world.shm, ShmScanner):
            # Deleted only when two observations agree and no process maps or holds the file.
            report = remove(world.shm)
            result["residue_removed"] = list(report.removed)
            result["residue_kept"] = [{"path": p, "why": why} for p, why in report.kept]
    return result


def managed_candidates(ctx: Context) -> list[dict[str, Any]]:
    world = ctx.world()
    return [
        {"container_id": c.id, "name": c.name, "status": c.status}
        for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_ROLE: "candidate"})
    ]
