"""`rollback` / `restore`: bring a recorded identity back exactly, as the same container ID.

Refused before mutation when the target identity is incomplete, its container
was removed, its image or config fingerprint changed, the restore group does not
contain it, or the router refuses our credentials. Steps: drain the tier (undo:
readmit what served); stop and retain what serves now (undo: start it again);
wait for VRAM release; start the target's same container ID and verify health
and identity; route the tier back and readmit; routed smoke; record it as the
incumbent and move GPU ownership. The transaction commits only if the slot's
placement afterwards equals the placement recorded when the target last served
(the diff is stored and shown). If anything fails after the target was started,
the target is stopped again and kept (never removed) and the transaction ends in
`needs_operator` with the reason: a person decides what serves next.

Placement is the snapshot without stopped non-incumbent containers: a candidate
retained for diagnosis does not make a restored host differ.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from anvil_ctl.core.errors import NeedsOperator
from anvil_ctl.core.guards import Guard, Refusal
from anvil_ctl.core.model import Identity
from anvil_ctl.core.snapshot import Snapshot, diff
from anvil_ctl.core.steps import Plan, Step, StepContext, StepResult
from anvil_ctl.engine.guards import guards_for
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.serving import (
    container_absent_or_stopped,
    restart_retained,
    route_slot_to,
    routed_smoke,
    stop_verified,
)
from anvil_ctl.engine.world import World


def _w(ctx: StepContext) -> World:
    world: World = ctx.world
    return world


def _target(ctx: StepContext) -> Identity:
    return Identity.from_dict(ctx.args["target"])


def _current(ctx: StepContext) -> Identity | None:
    data = ctx.args.get("current")
    return Identity.from_dict(data) if data else None


def placement(snapshot: Snapshot, slot: str) -> Snapshot:
    """The slot's placement: the snapshot without stopped containers other than the incumbent."""
    body = copy.deepcopy(snapshot.body)
    s = body.get("slots", {}).get(slot)
    if s is not None:
        incumbent = (s.get("incumbent") or {}).get("container_id")
        s["containers"] = {
            cid: c
            for cid, c in (s.get("containers") or {}).items()
            if cid == incumbent or c.get("status") == "running"
        }
    return Snapshot.of(body)


class TargetIdentityComplete(Guard):
    """The identity to restore is recorded with every required field."""

    kinds: ClassVar[frozenset[str]] = frozenset({"rollback"})

    def check(self, ctx: StepContext) -> Refusal | None:
        if not ctx.args.get("target"):
            return self.refuse(f"slot {ctx.args['slot']}: no rollback identity is recorded")
        missing = _target(ctx).missing()
        if missing:
            return self.refuse(f"rollback identity incomplete: missing {', '.join(missing)}")
        if not ctx.args.get("recorded_snapshot"):
            return self.refuse(
                "no recorded snapshot of the target serving: nothing to prove equality against"
            )
        return None


class TargetNotAlreadyServing(Guard):
    """There is something to restore: the target is not already the running, serving incumbent."""

    kinds: ClassVar[frozenset[str]] = frozenset({"rollback"})

    def check(self, ctx: StepContext) -> Refusal | None:
        if not ctx.args.get("target"):
            return None
        world, target = _w(ctx), _target(ctx)
        if container_absent_or_stopped(world, target.container_id):
            return None
        served = [m.id for m in world.engine.models(world.config.slot(target.slot).base_url)]
        if served == [target.served_model]:
            return self.refuse(
                f"{target.container_id[:12]} ({target.served_model}) already serves slot {target.slot}; "
                "nothing to restore (`anvilctl recheck` verifies it)"
            )
        return None


class RestoreGroupContainsTarget(Guard):
    """A named restore group must contain the declared rollback identity."""

    kinds: ClassVar[frozenset[str]] = frozenset({"rollback"})

    def check(self, ctx: StepContext) -> Refusal | None:
        group = ctx.args.get("restore_group")
        if group is None:
            return None
        members = [str(m) for m in ctx.args.get("restore_group_members") or []]
        target = _target(ctx)
        if not any(target.container_id.startswith(m) or target.digest.startswith(m) for m in members):
            return self.refuse(
                f"restore group {group!r} ({', '.join(m[:12] for m in members) or 'empty'}) does not "
                f"contain the declared rollback identity {target.container_id[:12]} "
                f"({target.served_model})",
                restore_group=group,
            )
        return None


def drain_tier(ctx: StepContext) -> StepResult:
    world, target = _w(ctx), _target(ctx)
    assert world.router is not None
    tier = world.config.slot(target.slot).router_tier
    world.router.drain(tier)
    return {"tier": tier}


def readmit_current(ctx: StepContext, _r: StepResult) -> StepResult:
    cur = _current(ctx)
    if cur is None or not ctx.args.get("current_routed"):
        return {"readmitted": None}
    return route_slot_to(_w(ctx), cur)


def stop_current(ctx: StepContext) -> StepResult:
    cur = _current(ctx)
    if cur is None:
        return {"stopped": None}
    return stop_verified(_w(ctx), cur.container_id)


def restart_current(ctx: StepContext, _r: StepResult) -> StepResult:
    cur = _current(ctx)
    if cur is None:
        return {"restarted": None}
    return restart_retained(_w(ctx), cur)


def release_vram(ctx: StepContext) -> StepResult:
    gate = _w(ctx).extras.get("vram_release")
    if gate is None:
        return {"skipped": "no GPU probe configured"}
    result: dict[str, Any] = gate(ctx, _target(ctx))
    return result


def start_target(ctx: StepContext) -> StepResult:
    return restart_retained(_w(ctx), _target(ctx))


def stop_target_needs_operator(ctx: StepContext, _r: StepResult) -> StepResult:
    """Stop the restored target again and keep it; then stop: a person decides."""
    world, target = _w(ctx), _target(ctx)
    stopped = None
    try:
        stopped = stop_verified(world, target.container_id)
    except Exception as exc:
        stopped = {"error": str(exc)}
    proven = container_absent_or_stopped(world, target.container_id)
    raise NeedsOperator(
        f"restore of {target.container_id[:12]} failed after it was started; it was stopped "
        f"again and retained ({'proven stopped' if proven else 'NOT proven stopped'}); "
        "decide what serves next, then `anvilctl rollback` again",
        stop=stopped,
        container_id=target.container_id,
    )


def route_back(ctx: StepContext) -> StepResult:
    return route_slot_to(_w(ctx), _target(ctx))


def smoke(ctx: StepContext) -> StepResult:
    return routed_smoke(_w(ctx), _target(ctx))


def record_restore(ctx: StepContext) -> StepResult:
    world, target, cur = _w(ctx), _target(ctx), _current(ctx)
    world.store.record_identity(ctx.tx_id, "incumbent", target)
    moved = world.extras.get("move_ownership")
    if moved is not None:
        moved(ctx, cur, target)
    return {"incumbent": target.container_id}


def unrecord_restore(ctx: StepContext, _r: StepResult) -> StepResult:
    world, target, cur = _w(ctx), _target(ctx), _current(ctx)
    if cur is not None and ctx.args.get("current_role") == "incumbent":
        world.store.record_identity(ctx.tx_id, "incumbent", cur)
    moved = world.extras.get("move_ownership")
    if moved is not None and cur is not None:
        moved(ctx, target, cur)
    return {"incumbent": cur.container_id if cur else None}


def verify_placement(ctx: StepContext, _before: Snapshot | None, after: Snapshot) -> list[str]:
    recorded = Snapshot(dict(ctx.args["recorded_snapshot"]))
    slot = str(ctx.args["slot"])
    want, got = placement(recorded, slot), placement(after, slot)
    changes = diff(want, got)
    _w(ctx).store.record_diff(ctx.tx_id, "recorded-restored", want, got, changes)
    return [f"{c.path}: recorded {c.before!r}, now {c.after!r}" for c in changes]


GUARDS = [TargetIdentityComplete(), TargetNotAlreadyServing(), RestoreGroupContainsTarget()]


def build(args: Mapping[str, Any], world: World) -> Plan:
    slot = str(args["slot"])
    steps: list[Step] = []
    if world.router is not None:
        steps.append(Step("drain-tier", drain_tier, readmit_current, "quiesce the slot's router tier"))
    steps += [
        Step("stop-current", stop_current, restart_current, "stop (retain) what serves now"),
        Step("release-vram", release_vram, None, "wait until the GPUs' memory is observed free"),
        Step(
            "start-target",
            start_target,
            stop_target_needs_operator,
            "start the same container ID; health and exact identity",
        ),
    ]
    if world.router is not None:
        steps += [
            Step("route-back", route_back, None, "route the tier back and readmit"),
            Step("routed-smoke", smoke, None, "authenticated routed chat by alias"),
        ]
    steps.append(Step("record-restore", record_restore, unrecord_restore, "target is the incumbent again"))
    return Plan(
        kind="rollback",
        args=args,
        steps=steps,
        guards=[*GUARDS, *guards_for("rollback")],
        slot=slot,
        snapshot=lambda: observe(world, [slot]),
        verify_after=verify_placement,
    )
