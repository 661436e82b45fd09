"""Commands that run transactions: adopt, load, recover; and the lock commands.

Each takes the command Context, holds the host lock for its whole life, and
returns an Outcome (or a report) for the CLI to render.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from anvil_ctl.commands.context import Context
from anvil_ctl.core.errors import BadInput, NotFound
from anvil_ctl.core.model import Identity
from anvil_ctl.core.steps import Plan, Step, StepContext, StepResult
from anvil_ctl.engine.lock import HostLock, held_locks
from anvil_ctl.engine.observe import observe, serving
from anvil_ctl.engine.plans import load as load_plan
from anvil_ctl.engine.plans import promote as promote_plan
from anvil_ctl.engine.plans import rollback as rollback_plan
from anvil_ctl.engine.recover import PlanBuilder, RecoverReport, recover
from anvil_ctl.engine.runner import Outcome, TransactionEngine
from anvil_ctl.engine.serving import Candidate
from anvil_ctl.engine.world import World
from anvil_ctl.persistence.locks import release_row


def _adopt_build(args: Mapping[str, Any], world: World) -> Plan:
    def record(ctx: StepContext) -> StepResult:
        ident = Identity.from_dict(ctx.args["identity"])
        world.store.record_identity(ctx.tx_id, "incumbent", ident)
        own = world.extras.get("record_ownership")
        if own is not None:
            own(ctx, ident)
        return {"identity_digest": ident.digest}

    return Plan(
        kind="adopt",
        args=args,
        steps=[Step("record-incumbent", record, None, "record the serving container as incumbent")],
        slot=str(args["slot"]),
        snapshot=lambda: observe(world, [str(args["slot"])]),
    )


BUILDERS: dict[str, PlanBuilder] = {
    "load": load_plan.build,
    "adopt": _adopt_build,
    "promote": promote_plan.build,
    "rollback": rollback_plan.build,
}


def register_builder(kind: str, builder: PlanBuilder) -> None:
    BUILDERS[kind] = builder


def run_plan(
    ctx: Context,
    kind: str,
    args: dict[str, Any],
    world: World,
    *,
    dry_run: bool,
    tx_id: str | None = None,
    locked: bool = False,
) -> Outcome:
    """Run a transaction; `locked` when the caller already holds the host lock (see `mutating`)."""
    plan = BUILDERS[kind](args, world)
    engine = TransactionEngine(ctx.store, ctx.owner)
    if dry_run:
        return engine.run(plan, world, dry_run=True)
    tx_id = tx_id or str(uuid.uuid4())
    if locked:
        return engine.run(plan, world, tx_id=tx_id)
    with HostLock(ctx.store, ctx.settings.lock_path, ctx.owner, kind, tx_id):
        return engine.run(plan, world, tx_id=tx_id)


@contextmanager
def mutating(ctx: Context, kind: str, tx_id: str, *, dry_run: bool) -> Iterator[None]:
    """Hold the host lock while a command reads the state its arguments are built from:
    identities read before the lock could be stale by the time the transaction runs.
    A dry run changes nothing and takes no lock."""
    if dry_run:
        yield
        return
    with HostLock(ctx.store, ctx.settings.lock_path, ctx.owner, kind, tx_id):
        yield


def adopt(
    ctx: Context,
    *,
    slot: str,
    container_id: str,
    context_tokens: int,
    dry_run: bool = False,
    recipe_digest: str = "",
    model_identity: str = "",
    gpu_roles: tuple[str, ...] = (),
) -> Outcome:
    """Record a serving container (started by hand or another tool) as the slot's incumbent."""
    world = ctx.world()
    slot_cfg = ctx.config.slot(slot)
    try:
        info = world.runtime.inspect(container_id)
    except NotFound:
        raise BadInput(f"container {container_id}: not found", field="container_id") from None
    observed = serving(world, slot_cfg.base_url)
    models = [m for m, _ in observed["models"]]
    if not info.running or len(models) != 1:
        raise BadInput(
            f"container {container_id[:12]} must be running and {slot_cfg.binding} must serve one model "
            f"(observed status {info.status}, models {models})",
            field="container_id",
        )
    image = world.runtime.image(info.image_id)
    ident = Identity(
        slot=slot,
        container_id=info.id,
        image_id=info.image_id,
        config_fingerprint=info.fingerprint,
        served_model=models[0],
        context_tokens=context_tokens,
        binding=slot_cfg.binding,
        router_tier=slot_cfg.router_tier,
        recipe_digest=recipe_digest,
        model_identity=model_identity,
        repo_digests=image.repo_digests,
        gpu_roles=gpu_roles or slot_cfg.gpu_roles,
        aliases=slot_cfg.aliases,
        container_name=info.name,
    )
    return run_plan(ctx, "adopt", {"slot": slot, "identity": ident.as_dict()}, world, dry_run=dry_run)


def load(
    ctx: Context,
    *,
    slot: str,
    candidate: Candidate,
    dry_run: bool = False,
    tx_id: str | None = None,
) -> Outcome:
    world = ctx.world()
    ctx.config.slot(slot)
    tx_id = tx_id or str(uuid.uuid4())
    with mutating(ctx, "load", tx_id, dry_run=dry_run):
        incumbent = ctx.store.current_identity(slot, "incumbent")
        running = False
        if incumbent is not None:
            from anvil_ctl.engine.serving import container_absent_or_stopped

            running = not container_absent_or_stopped(world, incumbent.container_id)
        args = {
            "slot": slot,
            "candidate": candidate.as_dict(),
            "incumbent": incumbent.as_dict() if incumbent else None,
            # Journaled before any mutation: compensation restores this, not more.
            "incumbent_running": running,
        }
        return run_plan(ctx, "load", args, world, dry_run=dry_run, tx_id=tx_id, locked=True)


def recover_all(ctx: Context) -> RecoverReport:
    world = ctx.world()
    lock = HostLock(ctx.store, ctx.settings.lock_path, ctx.owner, "recover")
    stale = lock.acquire(take_over_dead=True)
    try:
        report = recover(ctx.store, ctx.owner, BUILDERS, world)
        # A dead owner's lock row goes only once nothing it left is unresolved.
        if report.exit_code == 0:
            for dead in stale:
                release_row(ctx.store, dead.id, how="recovered", by=f"recover pid {ctx.owner.pid}")
                report.released_locks.append(dead.as_dict())
    finally:
        lock.release()
    return report


def lock_status(ctx: Context) -> list[dict[str, Any]]:
    return [h.as_dict() for h in held_locks(ctx.store)]


def lock_break(ctx: Context, lock_id: str, *, by: str, reason: str) -> dict[str, Any]:
    """Release a lock row by its exact ID (journaled); refuses a live local owner."""
    for h in held_locks(ctx.store):
        if h.id == lock_id:
            if h.alive:
                raise BadInput(f"{h.describe()}: the owner is alive; stop it instead", field="lock_id")
            release_row(ctx.store, lock_id, how="broken", by=by, reason=reason)
            return {"lock_id": lock_id, "broken": True, "was": h.as_dict()}
    raise BadInput(f"lock {lock_id} is not held", field="lock_id")


def resolve(ctx: Context, tx: str, *, by: str, note: str) -> dict[str, Any]:
    """A person records that they resolved a transaction that waits for one."""
    from anvil_ctl.core.states import TxState

    if not by.strip() or not note.strip():
        raise BadInput("--by and --note are required: who resolved it, and how", field="by")
    matches = [r for r in ctx.store.unresolved() if r.id.startswith(tx)]
    if len(matches) != 1:
        raise BadInput(f"transaction {tx!r}: no unique unresolved transaction matches", field="transaction")
    rec = matches[0]
    if rec.state not in (TxState.COMPENSATION_FAILED, TxState.NEEDS_OPERATOR):
        raise BadInput(
            f"transaction {rec.id[:8]} is {rec.state.value}: `anvilctl recover` handles it, not a person",
            field="transaction",
        )
    ctx.store.transition(rec.id, TxState.COMPENSATED, f"resolved by {by}: {note}", {"resolved_by": by})
    return {"tx_id": rec.id, "from": rec.state.value, "to": "compensated", "resolved_by": by}
