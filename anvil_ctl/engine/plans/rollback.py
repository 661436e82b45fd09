"""`rollback` / `restore`: bring a recorded identity back exactly, as the same container ID.

Pivot: `start-target`; the goal is that the tier routes to the target. The placement must then
equal the one recorded when the target last served, on identity-critical fields only; a
difference while the slot serves ends `needs_operator`, the slot left serving.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from anvil_ctl.core.errors import BadInput, NeedsOperator
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import VramNeed
from anvil_ctl.core.snapshot import Snapshot, diff, show_value
from anvil_ctl.core.steps import Guard, Hold, NoMemo, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.drain import drain_step, stop_retain_step
from anvil_ctl.engine.guards import (
    NoUnresolvedTransaction,
    RollbackIdentityRestorable,
    RouterCredentialsAccepted,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import RollbackArgs, RollbackRequest
from anvil_ctl.engine.serving import (
    is_running,
    release_vram_step,
    reroute,
    restart_retained,
    route_problems,
    route_step,
    smoke_step,
    stop_verified,
    tier_incumbent,
)
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import queries, snapshots
from anvil_ctl.persistence.queries import Revision
from anvil_ctl.persistence.store import Store

Ctx = StepContext[RollbackArgs, World, NoMemo]


# -- preparing: which serve comes back, and what serves now ------------------------------------


def is_revision(ref: str) -> bool:
    """A revision number of `audit history` (`3`); IDs are given with 8 characters or more."""
    return ref.isdigit() and len(ref) < 8


def check_to(ref: str) -> str:
    """`--to REF` is a revision number or a reference long enough to name one serve."""
    if not is_revision(ref) and len(ref) < 8 and not any(c in ref for c in "-._"):
        raise BadInput(
            f"--to {ref!r}: expected a revision number (audit history), or at least 8 characters "
            "of a transaction ID, container ID or identity digest, or a served model",
            field="to",
        )
    return ref


def resolve_target(store: Store, slot: str, ref: str) -> Identity:
    """What `rollback --to REF` brings back: the serve a revision left (`audit history --slot`),
    the serve a transaction left (ID or prefix), or a recorded identity by container ID,
    identity digest or served model. A prefix naming two different serves is refused."""
    if is_revision(ref):
        count, revisions = queries.slot_revisions(store, slot, store.host, number=int(ref))
        if not revisions:
            raise BadInput(f"--to {ref}: slot {slot} has revisions 1..{count}", field="to")
        return _left_by(store, revisions[0], ref, f"revision {ref}")
    _, by_tx = queries.slot_revisions(store, slot, store.host, tx_prefix=ref)
    by_ref = store.identity_by_ref(slot, ref)
    if len(by_tx) > 1:
        raise BadInput(f"--to {ref!r}: names transactions {[r['tx_id'] for r in by_tx]}", field="to")
    if by_tx:
        rev = by_tx[0]
        found = _left_by(store, rev, ref, f"transaction {rev['tx_id']}")
        if by_ref is not None and by_ref.digest != found.digest:
            raise BadInput(
                f"--to {ref!r}: names transaction {rev['tx_id']} and container "
                f"{by_ref.container_id[:12]}; give more characters",
                field="to",
            )
        return found
    if by_ref is None:
        raise BadInput(
            f"--to {ref!r}: no revision, transaction or recorded identity of slot {slot} matches", field="to"
        )
    return by_ref


def _left_by(store: Store, rev: Revision, ref: str, what: str) -> Identity:
    """The serve revision `rev` left, read through its transaction's identity rows."""
    serve = rev["serve"]
    if serve is None:
        raise BadInput(
            f"--to {ref!r}: {what} ({rev['kind']}, {rev['state']}) left no serve to bring back; "
            "expected a committed adopt, load, promote or rollback",
            field="to",
        )
    found = store.identity_of(rev["tx_id"], serve["role"])
    if found is None:  # the identity row came from the same history: only a cut record gets here
        raise BadInput(f"--to: the identity {what} recorded is not in the record", field="to")
    return found


def _serving_now(world: World, slot: str, target: Identity | None) -> tuple[Identity | None, str]:
    """What serves the slot now (to be stopped and retained), and its recorded role; of a
    canary's pair, the other slot's running incumbent serves this slot's clients too."""
    tier = world.config.slot(slot).router_tier
    siblings = [n for n, s in sorted(world.config.slots.items()) if n != slot and s.router_tier == tier]
    for name, role in [(slot, "incumbent"), (slot, "candidate"), *((n, "incumbent") for n in siblings)]:
        ident = world.store.current_identity(name, role)
        if (
            ident
            and (target is None or ident.container_id != target.container_id)
            and is_running(world, ident.container_id)
        ):
            return ident, role
    return None, ""


def prepare(world: World, req: RollbackRequest) -> RollbackArgs:
    """The target, what serves now, and the recorded snapshot the restore must equal."""
    store = world.store
    world.config.slot(req.slot)
    target: Identity | None
    if req.to:
        target = resolve_target(store, req.slot, check_to(req.to))
    else:
        # After a load the incumbent is stopped: restore it. After a promote the incumbent
        # serves: go back to the recorded rollback identity; after a canary, the incumbent it
        # replaced (recorded in that incumbent's own slot of the tier).
        incumbent = store.current_identity(req.slot, "incumbent")
        serving = incumbent is not None and is_running(world, incumbent.container_id)
        newest = store.newest_committed_revision(req.slot) if serving else None
        replaced = store.identity_of(newest[0], "rollback") if newest and newest[1] == "canary" else None
        target = (replaced or store.current_identity(req.slot, "rollback")) if serving else incumbent
    # A canary's way back is a rollback of the replaced incumbent's own slot, by either name.
    slot = target.slot if target is not None else req.slot
    current, role = _serving_now(world, slot, target)
    # The newest snapshot in which the target served the slot as its incumbent (running, its
    # binding answering with its model): not one taken while it was stopped.
    served = snapshots.served_snapshot(store, target) if target else None
    return RollbackArgs(
        slot=slot,
        target=target,
        current=current,
        current_role=role,
        current_routed=role == "incumbent",
        restore_group=req.restore_group,
        restore_group_members=req.restore_group_members,
        recorded_sha256=served[0] if served else None,
        decided_by=req.decided_by,
        drain=req.drain,
    )


def _target(ctx: Ctx) -> Identity:
    target = ctx.args.target
    if target is None:  # TargetIdentityComplete refuses this before any step
        raise NeedsOperator("rollback without a target identity reached a step")
    return target


def _current(ctx: Ctx) -> Identity | None:
    return ctx.args.current


def _routed_current(ctx: Ctx) -> Identity | None:
    return ctx.args.current if ctx.args.current_routed else None


def _object(value: JSONValue) -> JSONObject:
    """A snapshot's sub-object (the same dict), or {} where the snapshot has none."""
    return value if isinstance(value, dict) else {}


def placement(snapshot: Snapshot, slot: str) -> Snapshot:
    """The slot's placement: the snapshot without stopped containers other than the incumbent."""
    body = copy.deepcopy(snapshot.body)
    s = _object(body.get("slots")).get(slot)
    if isinstance(s, dict):
        incumbent = _object(s.get("incumbent")).get("container_id")
        s["containers"] = {
            cid: c
            for cid, c in _object(s.get("containers")).items()
            if cid == incumbent or _object(c).get("status") == "running"
        }
    return Snapshot.of(body)


def critical_placement(snapshot: Snapshot, slot: str) -> Snapshot:
    """The identity-critical fields of a slot's placement: what decides equality."""
    s = _object(_object(snapshot.body.get("slots")).get(slot))
    containers = {cid: _object(c) for cid, c in _object(s.get("containers")).items()}
    return Snapshot.of(
        {
            "incumbent": _object(s.get("incumbent")).get("container_id"),
            "running": {
                cid: {"image_id": c.get("image_id"), "fingerprint": c.get("fingerprint")}
                for cid, c in containers.items()
                if c.get("status") == "running"
            },
            "serving": _object(s.get("serving")).get("models"),
            "binding": s.get("binding"),
            "gpu_owners": snapshot.body.get("gpu_owners"),
        }
    )


class TargetIdentityComplete(Guard[Ctx]):
    """The identity to restore is recorded with every required field."""

    def check(self, ctx: Ctx) -> Refusal | None:
        target = ctx.args.target
        if target is None:
            serving = tier_incumbent(ctx.world, ctx.args.slot)
            other = (
                f"; its tier is served by slot {serving.slot}: rollback --slot {serving.slot}"
                if serving
                else ""
            )
            return self.refuse(f"slot {ctx.args.slot}: no rollback identity is recorded{other}")
        missing = target.missing()
        if missing:
            return self.refuse(f"rollback identity incomplete: missing {', '.join(missing)}")
        if not ctx.args.recorded_sha256:
            return self.refuse(
                "no recorded snapshot of the target serving: nothing to prove equality against"
            )
        return None


class TargetNotAlreadyServing(Guard[Ctx]):
    """There is something to restore: the target is not already the running, serving incumbent."""

    def check(self, ctx: Ctx) -> Refusal | None:
        target = ctx.args.target
        if target is None:
            return None
        world = ctx.world
        if not is_running(world, target.container_id):
            return None
        served = [m.id for m in world.server.models(world.config.slot(target.slot).base_url)]
        if served == [target.served_model]:
            return self.refuse(
                f"{target.container_id[:12]} ({target.served_model}) already serves slot {target.slot}; "
                "nothing to restore (`anvilctl recheck` verifies it)"
            )
        return None


class RestoreGroupContainsTarget(Guard[Ctx]):
    """A named restore group must contain the declared rollback identity."""

    def check(self, ctx: Ctx) -> Refusal | None:
        group, target = ctx.args.restore_group, ctx.args.target
        if group is None or target is None:
            return None
        members = list(ctx.args.restore_group_members or ())
        if not any(target.container_id.startswith(m) or target.digest.startswith(m) for m in members):
            return self.refuse(
                f"restore group {group!r} ({', '.join(m[:12] for m in members) or 'empty'}) does not "
                f"contain the declared rollback identity {target.container_id[:12]} "
                f"({target.served_model})",
                restore_group=group,
            )
        return None


def _gpu_request(ctx: Ctx) -> gpu_ownership.StartRequest | None:
    target, cur = ctx.args.target, ctx.args.current
    if target is None:
        return None
    replacing = {target.container_id} | ({cur.container_id} if cur else set())
    return target.gpu_roles, replacing


GUARDS: list[Guard[Ctx]] = [
    TargetIdentityComplete(),
    TargetNotAlreadyServing(),
    RestoreGroupContainsTarget(),
    NoUnresolvedTransaction(),
    RollbackIdentityRestorable(lambda ctx: ctx.args.target),
    gpu_ownership.GpuRolesFree(_gpu_request),
    RouterCredentialsAccepted(),
]


def _vram_need(ctx: Ctx) -> VramNeed:
    target = _target(ctx)
    return VramNeed(target.gpu_roles, 0, target.recipe_digest)


def start_target(ctx: Ctx) -> StepResult:
    return restart_retained(ctx.world, _target(ctx))


def stop_target(ctx: Ctx, _r: StepResult) -> StepResult:
    """Stop the target again, retained; the earlier undos bring back what served before."""
    target = _target(ctx)
    if not is_running(ctx.world, target.container_id):
        return {"stopped": None}
    return stop_verified(ctx.world, target.container_id)


def record_restore(ctx: Ctx) -> StepResult:
    world, target, cur = ctx.world, _target(ctx), _current(ctx)
    with world.store.together():  # records only: one database transaction, one audit entry
        world.store.record_identity(ctx.tx_id, "incumbent", target)
        gpu_ownership.record_ownership(world, ctx.tx_id, target, cur)
    return {"incumbent": target.container_id}


def unrecord_restore(ctx: Ctx, _r: StepResult) -> StepResult:
    world, target, cur = ctx.world, _target(ctx), _current(ctx)
    if cur is not None and ctx.args.current_role == "incumbent":
        world.store.record_identity(ctx.tx_id, "incumbent", cur)
    if cur is not None:
        gpu_ownership.record_ownership(world, ctx.tx_id, cur, target)
    return {"incumbent": cur.container_id if cur else None}


def _recorded_body(ctx: Ctx) -> Mapping[str, object]:
    """The recorded snapshot the restore must equal; {} if the record lost it."""
    sha = ctx.args.recorded_sha256
    return (snapshots.body_by_sha256(ctx.world.store, sha) if sha else None) or {}


def verify_placement(ctx: Ctx, _before: Snapshot | None, after: Snapshot, hold: Hold) -> list[str]:
    """Problems in the identity-critical fields; every difference is stored as a held diff."""
    # Normalizing changes nothing a placement reads: the recorded body is a stored snapshot's.
    recorded = Snapshot.of(_recorded_body(ctx))
    slot = ctx.args.slot
    want, got = placement(recorded, slot), placement(after, slot)
    changes = diff(want, got)
    hold(lambda: ctx.world.store.record_diff(ctx.tx_id, "recorded-restored", want, got, changes))
    critical = diff(critical_placement(recorded, slot), critical_placement(after, slot))
    return [
        f"{c.path}: recorded {'absent' if c.op == 'add' else show_value(c.before)}, "
        f"now {'absent' if c.op == 'remove' else show_value(c.after)}"
        for c in critical
    ]


def build(args: RollbackArgs, world: World, _req: object = None) -> Plan[RollbackArgs, World, NoMemo]:
    steps: list[Step[Ctx]] = []
    if world.router is not None:
        steps.append(drain_step(_routed_current, routes_next=lambda _ctx: True))
    steps += [
        stop_retain_step("stop-current", _current, "stop (retain) what serves now"),
        release_vram_step(_vram_need),
        Step(
            "start-target",
            start_target,
            stop_target,
            "start the same container ID; health and exact identity",
        ),
    ]
    if world.router is not None:
        steps += [
            route_step("route-back", _target, "route the tier back and readmit"),
            smoke_step(_target),
        ]
    steps.append(Step("record-restore", record_restore, unrecord_restore, "target is the incumbent again"))
    return Plan(
        kind="rollback",
        args=args,
        steps=steps,
        memo=NoMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        verify_after=verify_placement,
        pivot="start-target",
        goal=lambda ctx: route_problems(ctx.world, _target(ctx)),
        repair=reroute(_target) if world.router is not None else None,
    )
