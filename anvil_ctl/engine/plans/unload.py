"""`unload`: remove a candidate container that this controller created (`OurCandidateOnly`,
checked again just before the removal, its pivot)."""

from __future__ import annotations

from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.core.jsontypes import JSONArray
from anvil_ctl.core.model import LABEL_ROLE, LABEL_SLOT, ContainerInfo
from anvil_ctl.core.steps import Guard, NoMemo, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.drain import wait_idle
from anvil_ctl.engine.guards import NoUnresolvedTransaction
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import UnloadArgs, UnloadRequest
from anvil_ctl.engine.serving import inspect_or_none
from anvil_ctl.engine.world import World

Ctx = StepContext[UnloadArgs, World, NoMemo]


def removal_problem(world: World, info: ContainerInfo) -> str | None:
    """Why `info` must not be removed by unload (None: it may)."""
    if not info.managed or info.labels.get(LABEL_ROLE) != "candidate":
        return (
            f"container {info.id[:12]} ({info.name}) was not created by anvilctl as a candidate; "
            "refusing to remove it"
        )
    for role in ("incumbent", "rollback"):
        ident = world.store.current_identity(info.labels.get(LABEL_SLOT, ""), role)
        if ident and ident.container_id == info.id:
            return f"container {info.id[:12]} is the slot's {role}; refusing to remove it"
    return None


class OurCandidateOnly(Guard[Ctx]):
    """Only a container anvilctl created as a candidate is removed, never an incumbent
    or a rollback identity, and never anything we did not create."""

    def check(self, ctx: Ctx) -> Refusal | None:
        info = inspect_or_none(ctx.world, ctx.args.container_id)
        if info is None:
            return self.refuse(f"container {ctx.args.container_id[:12]} no longer exists")
        problem = removal_problem(ctx.world, info)
        return self.refuse(problem, container_id=info.id) if problem else None


GUARDS: list[Guard[Ctx]] = [OurCandidateOnly(), NoUnresolvedTransaction()]


def _checked(ctx: Ctx) -> ContainerInfo:
    """The container, its labels checked a second time just before acting."""
    info = inspect_or_none(ctx.world, ctx.args.container_id)
    if info is None:
        raise StepFailed(f"container {ctx.args.container_id[:12]} vanished")
    problem = removal_problem(ctx.world, info)
    if problem:
        raise StepFailed(problem)
    return info


def stop_candidate(ctx: Ctx) -> StepResult:
    """Drain the candidate first: a client may be reaching it directly (qualify, a trial)."""
    info = _checked(ctx)
    if not info.running:
        return {"container_id": info.id, "was_running": False}
    ident = ctx.world.store.current_identity(ctx.args.slot, "candidate")
    profile = ident.engine_profile if ident and ident.container_id == info.id else ""
    drained = wait_idle(ctx.world, ctx.args.slot, profile, f"{info.id[:12]} ({info.name})", ctx.args.drain)
    ctx.world.runtime.stop(info.id, engine_profile(profile).stop_timeout_s)
    return {"container_id": info.id, "was_running": True, "drain": drained}


def restart_candidate(ctx: Ctx, result: StepResult) -> StepResult:
    info = inspect_or_none(ctx.world, ctx.args.container_id)
    if info is None or info.running or not (result or {}).get("was_running"):
        return {"restarted": False}
    ctx.world.runtime.start(info.id)
    return {"restarted": True}


def remove_candidate(ctx: Ctx) -> StepResult:
    info = _checked(ctx)
    ctx.world.runtime.remove(info.id)
    return {"container_id": info.id, "name": info.name, "removed": True}


def release_roles(ctx: Ctx) -> StepResult:
    return {"released": list(gpu_ownership.release_all(ctx.world, ctx.args.container_id, ctx.tx_id))}


def record_residue(ctx: Ctx) -> StepResult:
    shm = ctx.world.shm
    residue: JSONArray = (
        [{"path": r.path, "size": r.size, "pids": list(r.pids)} for r in shm.residue()] if shm else []
    )
    return {"shm_residue": residue}


def remove_residue(ctx: Ctx) -> StepResult:
    shm = ctx.world.shm
    if shm is None:
        return {"removed": [], "kept": []}
    report = shm.remove_unheld()
    return {"removed": list(report.removed), "kept": [{"path": p, "why": w} for p, w in report.kept]}


def prepare(world: World, req: UnloadRequest) -> UnloadArgs:
    """The container by its full ID, and the slot its labels name."""
    info = inspect_or_none(world, req.container_id)
    if info is None:
        raise BadInput(f"container {req.container_id}: not found", field="container_id")
    return UnloadArgs(
        container_id=info.id,
        slot=info.labels.get(LABEL_SLOT, ""),
        remove_residue=req.remove_residue,
        drain=req.drain,
    )


def build(args: UnloadArgs, world: World, _req: object = None) -> Plan[UnloadArgs, World, NoMemo]:
    steps: list[Step[Ctx]] = [
        Step("stop-candidate", stop_candidate, restart_candidate, "stop the candidate (labels re-checked)"),
        Step("remove-candidate", remove_candidate, None, "remove the container (no way back)"),
        Step("release-roles", release_roles, None, "release the GPU roles it owned"),
        Step("record-residue", record_residue, None, "shared-memory residue left behind"),
    ]
    if args.remove_residue:
        steps.append(
            Step("remove-residue", remove_residue, None, "delete residue two observations agree is unheld")
        )
    return Plan(
        kind="unload",
        args=args,
        steps=steps,
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        pivot="remove-candidate",
        keeps_serving=False,  # a person asked for this container to go
    )
