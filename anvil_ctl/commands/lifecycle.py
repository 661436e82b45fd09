"""promote and rollback/restore: gather the identities, decision and recorded snapshot, then run."""

from __future__ import annotations

import uuid
from typing import Any

from anvil_ctl.commands.context import Context
from anvil_ctl.commands.transactions import mutating, run_plan
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import Identity
from anvil_ctl.engine.plans import promote as promote_plan
from anvil_ctl.engine.runner import Outcome


def promote(
    ctx: Context,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None = None,
    dry_run: bool = False,
) -> Outcome:
    ctx.config.slot(slot)
    tx_id = str(uuid.uuid4())
    with mutating(ctx, "promote", tx_id, dry_run=dry_run):
        return _promote_locked(
            ctx, slot=slot, approved_by=approved_by, candidate=candidate, dry_run=dry_run, tx_id=tx_id
        )


def _promote_locked(
    ctx: Context, *, slot: str, approved_by: str, candidate: str | None, dry_run: bool, tx_id: str
) -> Outcome:
    cand = ctx.store.current_identity(slot, "candidate")
    if cand is None:
        raise BadInput(f"slot {slot}: no candidate has been loaded", field="candidate")
    if candidate and not (
        cand.container_id.startswith(candidate)
        or cand.served_model == candidate
        or cand.digest.startswith(candidate)
    ):
        raise BadInput(
            f"candidate {candidate!r} is not the slot's loaded candidate "
            f"({cand.container_id[:12]}, {cand.served_model})",
            field="candidate",
        )
    incumbent = ctx.store.current_identity(slot, "incumbent")
    world = ctx.world()
    decision = promote_plan.standing_decision(world, cand.qualification_digest)
    args = {
        "slot": slot,
        "candidate": cand.as_dict(),
        "incumbent": incumbent.as_dict() if incumbent else None,
        "decision_id": decision["id"] if decision else None,
        "approved_by": approved_by,
    }
    return run_plan(ctx, "promote", args, world, dry_run=dry_run, tx_id=tx_id, locked=True)


def _identity_by_ref(ctx: Context, slot: str, ref: str) -> Identity | None:
    if len(ref) < 8 and not any(c in ref for c in "-._"):
        raise BadInput(f"--to {ref!r}: give at least 8 characters of a container ID or digest", field="to")
    return ctx.store.identity_by_ref(slot, ref)


def recorded_snapshot(ctx: Context, target: Identity) -> dict[str, Any] | None:
    """The newest recorded snapshot in which `target` served the slot as its incumbent.

    Serving means: recorded as the slot's incumbent, its container running, and the
    binding answering with its served model. Snapshots taken while it was stopped
    (a campaign of several loads) do not count.
    """
    return ctx.store.served_snapshot(target)


def rollback(
    ctx: Context,
    *,
    slot: str,
    to: str | None = None,
    restore_group: str | None = None,
    dry_run: bool = False,
) -> Outcome:
    ctx.config.slot(slot)
    tx_id = str(uuid.uuid4())
    with mutating(ctx, "rollback", tx_id, dry_run=dry_run):
        return _rollback_locked(
            ctx, slot=slot, to=to, restore_group=restore_group, dry_run=dry_run, tx_id=tx_id
        )


def _rollback_locked(
    ctx: Context, *, slot: str, to: str | None, restore_group: str | None, dry_run: bool, tx_id: str
) -> Outcome:
    world = ctx.world()
    target: Identity | None
    if to:
        target = _identity_by_ref(ctx, slot, to)
        if target is None:
            raise BadInput(f"--to {to!r}: no recorded identity of slot {slot} matches", field="to")
    else:
        # After a load the incumbent is stopped: restore it. After a promote the incumbent
        # serves: go back to the recorded rollback identity.
        incumbent = ctx.store.current_identity(slot, "incumbent")
        serving_incumbent = incumbent is not None and _running(world, incumbent.container_id)
        target = ctx.store.current_identity(slot, "rollback") if serving_incumbent else incumbent
    members: list[str] | None = None
    if restore_group is not None:
        if restore_group not in ctx.config.restore_groups:
            raise BadInput(
                f"--restore-group {restore_group!r}: not in the host config's restore_groups "
                f"({sorted(ctx.config.restore_groups)})",
                field="restore_group",
            )
        members = list(ctx.config.restore_groups[restore_group])
    current, role = _serving_now(ctx, world, slot, target)
    args = {
        "slot": slot,
        "target": target.as_dict() if target else None,
        "current": current.as_dict() if current else None,
        "current_role": role,
        "current_routed": role == "incumbent",
        "restore_group": restore_group,
        "restore_group_members": members,
        "recorded_snapshot": recorded_snapshot(ctx, target) if target else None,
    }
    return run_plan(ctx, "rollback", args, world, dry_run=dry_run, tx_id=tx_id, locked=True)


def _running(world: Any, container_id: str) -> bool:
    from anvil_ctl.engine.serving import container_absent_or_stopped

    return not container_absent_or_stopped(world, container_id)


def _serving_now(ctx: Context, world: Any, slot: str, target: Identity | None) -> tuple[Identity | None, str]:
    """What serves the slot now (to be stopped and retained), and its recorded role."""
    for role in ("incumbent", "candidate"):
        ident = ctx.store.current_identity(slot, role)
        if (
            ident
            and (target is None or ident.container_id != target.container_id)
            and _running(world, ident.container_id)
        ):
            return ident, role
    return None, ""
