"""`load`: put a candidate on a slot, the incumbent stopped and retained.

Steps (each with its undo): drain the slot's router tier (readmit the incumbent);
stop the incumbent, never remove it (start the same container ID again); wait for
its VRAM to be observed free; create and start the candidate (stop it, keep it
for diagnosis only when proven stopped, else remove it); wait for health and the
exact served identity; record the candidate's identity and GPU ownership.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from anvil_ctl.core.errors import NotFound
from anvil_ctl.core.model import LABEL_TX, ContainerSpec, Identity
from anvil_ctl.core.steps import Plan, Step, StepContext, StepResult
from anvil_ctl.engine.guards import guards_for
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.serving import (
    Candidate,
    restart_retained,
    route_slot_to,
    stop_verified,
    wait_serving,
)
from anvil_ctl.engine.world import World


def _w(ctx: StepContext) -> World:
    world: World = ctx.world
    return world


def _incumbent(ctx: StepContext) -> Identity | None:
    data = ctx.args.get("incumbent")
    return Identity.from_dict(data) if data else None


def _candidate(ctx: StepContext) -> Candidate:
    return Candidate.from_dict(ctx.args["candidate"])


def drain_tier(ctx: StepContext) -> StepResult:
    world, slot = _w(ctx), _w(ctx).config.slot(ctx.args["slot"])
    assert world.router is not None
    world.router.drain(slot.router_tier)
    return {"tier": slot.router_tier}


def readmit_incumbent(ctx: StepContext, _result: StepResult) -> StepResult:
    ident = _incumbent(ctx)
    assert ident is not None
    return route_slot_to(_w(ctx), ident)


def stop_incumbent(ctx: StepContext) -> StepResult:
    ident = _incumbent(ctx)
    assert ident is not None
    return stop_verified(_w(ctx), ident.container_id)


def restart_incumbent(ctx: StepContext, _result: StepResult) -> StepResult:
    ident = _incumbent(ctx)
    assert ident is not None
    return restart_retained(_w(ctx), ident)


def release_vram(ctx: StepContext) -> StepResult:
    gate = _w(ctx).extras.get("vram_release")
    if gate is None:
        return {"skipped": "no GPU probe configured"}
    result: dict[str, Any] = gate(ctx, _candidate(ctx))
    return result


def stamped_spec(spec: ContainerSpec, tx_id: str) -> ContainerSpec:
    """The spec labelled with the transaction that creates it, so recover can find it by label."""
    labels = {k: v for k, v in spec.labels if k != LABEL_TX}
    labels[LABEL_TX] = tx_id
    return replace(spec, labels=tuple(sorted(labels.items())))


def start_candidate(ctx: StepContext) -> StepResult:
    world, cand = _w(ctx), _candidate(ctx)
    container_id = world.runtime.create(stamped_spec(cand.spec, ctx.tx_id))
    world.runtime.start(container_id)
    return {"container_id": container_id, "name": cand.spec.name}


def _candidate_ids(ctx: StepContext, result: StepResult) -> list[str]:
    if result and result.get("container_id"):
        return [str(result["container_id"])]
    # The process died between create and the result row: find it by its transaction label.
    return [c.id for c in _w(ctx).runtime.list(labels={LABEL_TX: ctx.tx_id})]


def stop_candidate(ctx: StepContext, result: StepResult) -> StepResult:
    world = _w(ctx)
    kept, removed = [], []
    for cid in _candidate_ids(ctx, result):
        try:
            world.runtime.stop(cid, world.config.policy.stop_timeout_s)
            proven_stopped = not world.runtime.inspect(cid).running
        except NotFound:
            continue
        except Exception:
            proven_stopped = False
        if proven_stopped:
            kept.append(cid)  # kept for diagnosis: `anvilctl unload` removes it
        else:
            world.runtime.remove(cid)
            removed.append(cid)
    return {"kept_stopped": kept, "removed": removed}


def await_candidate(ctx: StepContext) -> StepResult:
    world, cand = _w(ctx), _candidate(ctx)
    slot = world.config.slot(ctx.args["slot"])
    return wait_serving(world, slot.base_url, cand.health_path, cand.served_model, cand.startup_timeout_s)


def candidate_identity(world: World, slot_name: str, cand: Candidate, container_id: str) -> Identity:
    info = world.runtime.inspect(container_id)
    slot = world.config.slot(slot_name)
    image = world.runtime.image(info.image_id)
    return Identity(
        slot=slot_name,
        container_id=info.id,
        image_id=info.image_id,
        config_fingerprint=info.fingerprint,
        served_model=cand.served_model,
        context_tokens=cand.context_tokens,
        binding=slot.binding,
        router_tier=slot.router_tier,
        recipe_digest=cand.recipe_digest,
        model_identity=cand.model_identity,
        repo_digests=image.repo_digests,
        gpu_roles=cand.gpu_roles,
        aliases=slot.aliases,
        container_name=info.name,
    )


def record_candidate(ctx: StepContext) -> StepResult:
    world, cand = _w(ctx), _candidate(ctx)
    ident = candidate_identity(world, ctx.args["slot"], cand, ctx.result("start-candidate")["container_id"])
    world.store.record_identity(ctx.tx_id, "candidate", ident)
    own = world.extras.get("record_ownership")
    if own is not None:
        own(ctx, ident)
    return {"identity_digest": ident.digest, "container_id": ident.container_id}


def release_candidate_record(ctx: StepContext, _result: StepResult) -> StepResult:
    release = _w(ctx).extras.get("release_ownership")
    if release is not None:
        release(ctx)
    return {"released": True}


def build(args: Mapping[str, Any], world: World) -> Plan:
    # An incumbent already stopped (a campaign of several loads) is neither drained, stopped
    # nor, on compensation, started again: the undo restores the before state, not more.
    has_incumbent = args.get("incumbent") is not None and bool(args.get("incumbent_running", True))
    steps: list[Step] = []
    if has_incumbent and world.router is not None:
        steps.append(Step("drain-tier", drain_tier, readmit_incumbent, "quiesce the slot's router tier"))
    if has_incumbent:
        steps.append(
            Step(
                "stop-incumbent",
                stop_incumbent,
                restart_incumbent,
                "stop (never remove) the incumbent",
            )
        )
    steps += [
        Step("release-vram", release_vram, None, "wait until the GPUs' memory is observed free"),
        Step("start-candidate", start_candidate, stop_candidate, "create and start the candidate"),
        Step("await-candidate", await_candidate, None, "health and exact served identity"),
        Step(
            "record-candidate",
            record_candidate,
            release_candidate_record,
            "identity and GPU ownership",
        ),
    ]
    return Plan(
        kind="load",
        args=args,
        steps=steps,
        guards=guards_for("load"),
        slot=str(args["slot"]),
        snapshot=lambda: observe(world, [str(args["slot"])]),
    )
