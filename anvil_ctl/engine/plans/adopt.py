"""`adopt`: record a serving container (started by hand or another tool) as the slot's incumbent;
one step that changes only the record, after `prepare` observed it serving."""

from __future__ import annotations

from anvil_ctl.core.engine_profile import ENGINE_PROFILES, engine_profile
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.steps import NoMemo, Plan, Step, StepContext, StepResult
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.assertions import observe_context
from anvil_ctl.engine.observe import observe, serving
from anvil_ctl.engine.plans.args import AdoptArgs, AdoptRequest
from anvil_ctl.engine.serving import inspect_or_none
from anvil_ctl.engine.world import World

Ctx = StepContext[AdoptArgs, World, NoMemo]


def prepare(world: World, req: AdoptRequest) -> AdoptArgs:
    """The container's identity as observed now; BadInput unless it serves as `req` says."""
    if req.engine and req.engine not in ENGINE_PROFILES:
        raise BadInput(f"--engine {req.engine!r}: expected one of {sorted(ENGINE_PROFILES)}", field="engine")
    profile = engine_profile(req.engine)
    slot_cfg = world.config.slot(req.slot)
    info = inspect_or_none(world, req.container_id)
    if info is None:
        raise BadInput(f"container {req.container_id}: not found", field="container_id")
    observed = serving(world, slot_cfg.base_url, profile.health_path)
    models = [m for m, _ in observed["models"]]
    if not info.running or len(models) != 1 or not observed["healthy"]:
        raise BadInput(
            f"container {req.container_id[:12]} must be running and {slot_cfg.binding} must serve one "
            f"model healthy (observed status {info.status}, models {models}, healthy "
            f"{observed['healthy']}; engine profile {profile.name})",
            field="container_id",
        )
    seen = observe_context(world, profile, slot_cfg.base_url, models[0], req.context_tokens)
    if not seen.matches(req.context_tokens):
        # Recording a context the engine does not serve would make every recheck report drift.
        raise BadInput(
            f"--context-tokens {req.context_tokens}: {slot_cfg.binding} {seen.describe()} "
            f"(engine profile {profile.name})",
            field="context_tokens",
        )
    identity = Identity(
        slot=req.slot,
        container_id=info.id,
        image_id=info.image_id,
        config_fingerprint=info.fingerprint,
        served_model=models[0],
        context_tokens=req.context_tokens,
        binding=slot_cfg.binding,
        router_tier=slot_cfg.router_tier,
        recipe_digest=req.recipe_digest,
        model_identity=req.model_identity,
        repo_digests=world.runtime.image(info.image_id).repo_digests,
        gpu_roles=req.gpu_roles or slot_cfg.gpu_roles,
        aliases=slot_cfg.aliases,
        container_name=info.name,
        engine_profile=req.engine,
    )
    return AdoptArgs(slot=req.slot, identity=identity)


def record_incumbent(ctx: Ctx) -> StepResult:
    ident = ctx.args.identity
    ctx.world.store.record_identity(ctx.tx_id, "incumbent", ident)
    gpu_ownership.record_ownership(ctx.world, ctx.tx_id, ident, None)
    return {"identity_digest": ident.digest}


def build(args: AdoptArgs, world: World, _req: object = None) -> Plan[AdoptArgs, World, NoMemo]:
    return Plan(
        kind="adopt",
        args=args,
        steps=[Step("record-incumbent", record_incumbent, None, "record the serving container as incumbent")],
        memo=NoMemo(),
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        keeps_serving=False,  # only the record changes
    )
