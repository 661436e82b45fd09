"""`load`: put a candidate on a slot, the incumbent stopped and retained. Pivot:
`start-candidate`. A committed load leaves the tier drained by design: the candidate is reached
directly until `promote` routes it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from anvil_ctl.core.errors import AdapterError, NotFound
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT, LABEL_TX, ContainerSpec, VramNeed
from anvil_ctl.core.steps import Guard, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.drain import drain_step, stop_retain_step
from anvil_ctl.engine.guards import (
    BaseVerified,
    NoUnresolvedTransaction,
    RollbackIdentityComplete,
    RollbackIdentityRestorable,
    RouterCredentialsAccepted,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import Candidate, LoadArgs, LoadRequest
from anvil_ctl.engine.serving import (
    is_running,
    release_vram_step,
    wait_serving,
)
from anvil_ctl.engine.world import World
from anvil_ctl.recipes.spec import short_tx


@dataclass
class LoadMemo:
    candidate_id: str | None = None
    """The container `start-candidate` created."""
    candidate: Identity | None = None
    """Its identity, read while it got ready: `record-candidate` then only writes."""


Ctx = StepContext[LoadArgs, World, LoadMemo]


def _running_incumbent(ctx: Ctx) -> Identity | None:
    return ctx.args.incumbent if ctx.args.incumbent_running else None


class CandidateImagePinned(Guard[Ctx]):
    """The candidate's image is present on the host with exactly the pinned ID or digest."""

    def check(self, ctx: Ctx) -> Refusal | None:
        ref = ctx.args.candidate.spec.image
        try:
            image = ctx.world.runtime.image(ref)
        except NotFound:
            return self.refuse(f"pinned image {ref} is not present on this host", image=ref)
        if ref.startswith("sha256:") and image.id != ref:
            return self.refuse(f"image {ref} resolves to {image.id}", image=ref)
        if "@sha256:" in ref and ref not in image.repo_digests:
            return self.refuse(f"image digest {ref} not among {list(image.repo_digests)}", image=ref)
        return None


class ModelCacheComplete(Guard[Ctx]):
    """A candidate that pins a model finds it complete in the model cache before anything stops,
    every pinned file with exactly its size and SHA-256: a corrupt file is never loaded."""

    def check(self, ctx: Ctx) -> Refusal | None:
        cand = ctx.args.candidate
        if not cand.model_identity:
            return None
        cache = ctx.world.model_cache
        if cache is None:
            return self.refuse(
                f"recipe {cand.recipe} pins model {cand.model_identity} but the host config sets no "
                "model_cache_dir to verify it in"
            )
        if cand.model_files:
            report = cache.verify_files(cand.model_identity, cand.model_files)
        else:
            report = cache.verify_identity(cand.model_identity)
        if not report.complete:
            return self.refuse(
                f"model cache does not hold {cand.model_identity} as pinned: {'; '.join(report.problems)}",
                problems=list(report.problems),
            )
        return None


class BindingNotTaken(Guard[Ctx]):
    """No running container of this slot other than the incumbent holds the slot's binding."""

    def check(self, ctx: Ctx) -> Refusal | None:
        world, ident, slot_name = ctx.world, ctx.args.incumbent, ctx.args.slot
        others = [
            c
            for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: slot_name})
            if c.running and (ident is None or c.id != ident.container_id)
        ]
        if others:
            return self.refuse(
                f"slot {slot_name}: container {others[0].id[:12]} ({others[0].name}) is running "
                "besides the incumbent; unload it first",
                container_id=others[0].id,
            )
        slot = world.config.slot(slot_name)
        if _running_incumbent(ctx) is None and world.server.listening(slot.base_url):
            return self.refuse(
                f"binding {slot.binding} accepts connections but no recorded serve runs there: "
                "something we do not own holds it"
            )
        if ident is not None:
            served = [m.id for m in world.server.models(slot.base_url)]
            if served and served != [ident.served_model]:
                return self.refuse(
                    f"binding {slot.binding} serves {served}, "
                    f"not the recorded incumbent {ident.served_model!r}: something we do not own holds it"
                )
        return None


def _gpu_request(ctx: Ctx) -> gpu_ownership.StartRequest:
    inc = ctx.args.incumbent
    return ctx.args.candidate.gpu_roles, {inc.container_id} if inc else set()


GUARDS: list[Guard[Ctx]] = [
    NoUnresolvedTransaction(),
    RollbackIdentityComplete(),
    RollbackIdentityRestorable(lambda ctx: ctx.args.incumbent),
    CandidateImagePinned(),
    ModelCacheComplete(),
    BindingNotTaken(),
    BaseVerified(_running_incumbent, routed=True),
    gpu_ownership.GpuRolesFree(_gpu_request),
    RouterCredentialsAccepted(),
]


def stamped_spec(spec: ContainerSpec, tx_id: str) -> ContainerSpec:
    """The spec labelled (and, if made for no transaction yet, named) with the transaction that
    creates it, so recover can find it by label."""
    labels = dict(spec.labels)
    name = spec.name if LABEL_TX in labels else f"{spec.name}-{short_tx(tx_id)}"
    labels[LABEL_TX] = tx_id
    return replace(spec, name=name, labels=tuple(sorted(labels.items())))


def start_candidate(ctx: Ctx) -> StepResult:
    world, cand = ctx.world, ctx.args.candidate
    spec = stamped_spec(cand.spec, ctx.tx_id)
    container_id = world.runtime.create(spec)
    world.runtime.start(container_id)
    return {"container_id": container_id, "name": spec.name}


def remember_candidate(ctx: Ctx, result: JSONObject) -> None:
    ctx.memo.candidate_id = str(result["container_id"])


def stop_candidate(ctx: Ctx, _result: StepResult) -> StepResult:
    world = ctx.world
    kept, removed = [], []
    known = ctx.memo.candidate_id
    # None: the process died between create and the result row: find it by its transaction label.
    for cid in [known] if known else [c.id for c in world.runtime.list(labels={LABEL_TX: ctx.tx_id})]:
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
    return {"kept_stopped": list(kept), "removed": list(removed)}


def await_candidate(ctx: Ctx) -> StepResult:
    world, cand = ctx.world, ctx.args.candidate
    slot = world.config.slot(ctx.args.slot)
    if ctx.memo.candidate_id is not None:
        with contextlib.suppress(AdapterError):  # gone already: the wait below says how
            ctx.memo.candidate = candidate_identity(world, ctx.args.slot, cand, ctx.memo.candidate_id)
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
        engine_profile=cand.engine_profile,
    )


def record_candidate(ctx: Ctx) -> StepResult:
    world = ctx.world
    assert ctx.memo.candidate_id is not None, "start-candidate runs first"
    ident = ctx.memo.candidate
    if ident is None or ident.container_id != ctx.memo.candidate_id:  # resumed by recover
        ident = candidate_identity(world, ctx.args.slot, ctx.args.candidate, ctx.memo.candidate_id)
    with world.store.together():  # records only: one database transaction, one audit entry
        world.store.record_identity(ctx.tx_id, "candidate", ident)
        gpu_ownership.record_ownership(world, ctx.tx_id, ident, ctx.args.incumbent)
    return {"identity_digest": ident.digest, "container_id": ident.container_id}


def release_candidate_record(ctx: Ctx, _result: StepResult) -> StepResult:
    gpu_ownership.release_ownership(ctx.world, ctx.tx_id, ctx.args.incumbent)
    return {"released": True}


def _vram_need(ctx: Ctx) -> VramNeed:
    cand = ctx.args.candidate
    return VramNeed(cand.gpu_roles, cand.vram_need_mib, cand.recipe_digest)


def prepare(world: World, req: LoadRequest) -> LoadArgs:
    """The slot's incumbent, and whether it runs: what compensation restores, not more."""
    world.config.slot(req.slot)
    incumbent = world.store.current_identity(req.slot, "incumbent")
    return LoadArgs(
        slot=req.slot,
        candidate=req.candidate,
        incumbent=incumbent,
        incumbent_running=incumbent is not None and is_running(world, incumbent.container_id),
        accept_drift=req.accept_drift,
        drain=req.drain,
        then=req.then,
    )


def build(args: LoadArgs, world: World, _req: object = None) -> Plan[LoadArgs, World, LoadMemo]:
    # An incumbent already stopped (a campaign of several loads) is neither drained, stopped
    # nor, on compensation, started again: the undo restores the before state, not more.
    has_incumbent = args.incumbent is not None and args.incumbent_running
    steps: list[Step[Ctx]] = []
    if has_incumbent and world.router is not None:
        steps.append(drain_step(_running_incumbent, routes_next=lambda ctx: ctx.args.then is not None))
    if has_incumbent:
        steps.append(
            stop_retain_step("stop-incumbent", _running_incumbent, "stop (never remove) the incumbent")
        )
    steps += [
        release_vram_step(_vram_need),
        Step(
            "start-candidate",
            start_candidate,
            stop_candidate,
            "create and start the candidate",
            remember=remember_candidate,
        ),
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
        memo=LoadMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        pivot="start-candidate",
    )
