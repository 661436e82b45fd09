"""load and unload from recipes: build the Candidate, run the transaction, remove what we made."""

from __future__ import annotations

from dataclasses import replace

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import recipes as recipe_cmds
from anvil_ctl.commands.transactions import enter, limit_waits
from anvil_ctl.commands.transactions import load as load_tx
from anvil_ctl.core.errors import BadInput, NotFound, Refused
from anvil_ctl.core.model import DrainPolicy, OnDrainTimeout
from anvil_ctl.core.validate import check_person, require
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import Candidate, DriftAcceptance, PromoteRequest, UnloadRequest
from anvil_ctl.engine.plans.unload import removal_problem
from anvil_ctl.recipes.model import load_recipe, recipe_digest
from anvil_ctl.recipes.spec import check_runnable, container_spec


def candidate_from_recipe(app: App, ref: str, slot: str) -> Candidate:
    path = recipe_cmds.resolve_recipe_path(ref, recipe_cmds.recipe_search(app))
    recipe = load_recipe(path)
    check_runnable(recipe)
    slot_cfg = app.config.slot(slot)
    spec = container_spec(recipe, slot_name=slot, slot=slot_cfg, host_config=app.config, recipe_path=path)
    # The simulated GPU probe and operators find a serve's endpoint by this label.
    spec = replace(spec, labels=(*spec.labels, ("io.anvil.binding", slot_cfg.binding)))
    if recipe.served_model is None:
        raise BadInput(f"{path}: served_model: required to load", field="served_model")
    return Candidate(
        recipe=recipe.name,
        recipe_digest=recipe_digest(recipe),
        served_model=recipe.served_model,
        context_tokens=recipe.context_tokens,
        health_path=recipe.effective_health_path,
        startup_timeout_s=recipe.startup_timeout_s,
        spec=spec,
        gpu_roles=tuple(recipe.gpu_roles),
        model_identity=recipe.model or "",
        max_concurrency=recipe.max_concurrency or 1,
        vram_need_mib=recipe.vram_need_mib,
        engine_profile=recipe.profile_of_engine.name,
        model_files=tuple(f.pin() for f in recipe.model_files),
        drain_timeout_s=recipe.drain_timeout_s,
    )


def load(
    app: App,
    ref: str,
    *,
    slot: str,
    dry_run: bool = False,
    accept_drift: DriftAcceptance | None = None,
    timeout_s: float | None = None,
    drain_timeout_s: float | None = None,
    on_drain_timeout: OnDrainTimeout | None = None,
    promote_approved_by: str | None = None,
) -> Outcome:
    """Load `ref` into `slot`; `timeout_s` caps each forward wait, the incumbent's drain waits
    `drain_timeout_s` (default: the recipe's). `promote_approved_by`: once the load commits,
    promote its candidate under the same lock as its own transaction (`engine.entry`)."""
    if promote_approved_by is not None:
        promote_approved_by = require("--approved-by", check_person, promote_approved_by)
        if not dry_run:
            app.warm_acceptance()  # first, as promote does: the child holds none of the world's connections
            # What the promotion's `prepare` loads to resolve its watch (the qualify library),
            # loaded now: between the load's commit and the route, clients wait for it.
            import anvil_ctl.engine.watch  # noqa: F401
    limit_waits(app, timeout_s)
    cand = candidate_from_recipe(app, ref, slot)
    drain = DrainPolicy.of(drain_timeout_s or cand.drain_timeout_s, on_drain_timeout, default="abort")
    # Under the load's lock the slot's loaded candidate is the one this load started.
    then = None if promote_approved_by is None else PromoteRequest(slot=slot, approved_by=promote_approved_by)
    return load_tx(
        app, slot=slot, candidate=cand, dry_run=dry_run, accept_drift=accept_drift, drain=drain, then=then
    )


def unload(
    app: App,
    container_id: str,
    *,
    yes: bool = False,
    remove_residue: bool = False,
    drain_timeout_s: float | None = None,
    on_drain_timeout: OnDrainTimeout | None = None,
) -> Outcome | dict[str, object]:
    """Remove a candidate container this controller created; without `yes` only say what would
    be removed, after the plan guard's checks."""
    if yes:
        drain = DrainPolicy.of(drain_timeout_s, on_drain_timeout, default="abort")
        return enter(
            app, UnloadRequest(container_id=container_id, remove_residue=remove_residue, drain=drain)
        )
    world = app.world()
    try:
        info = world.runtime.inspect(container_id)
    except NotFound:
        raise BadInput(f"container {container_id}: not found", field="container_id") from None
    problem = removal_problem(world, info)
    if problem:
        raise Refused(problem, container_id=info.id)
    return {"container_id": info.id, "would_remove": True, "hint": "pass --yes to remove"}
