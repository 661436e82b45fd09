"""promote and rollback/restore: gather the identities, decision and recorded snapshot, then run."""

from __future__ import annotations

import uuid
from typing import Any

from anvil_ctl.bootstrap import Context
from anvil_ctl.commands.transactions import mutating, run_plan
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import Identity
from anvil_ctl.core.validate import check_person, require
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.engine.plans.args import DriftAcceptance, PromoteArgs, RollbackArgs
from anvil_ctl.engine.plans.promote import standing_decision
from anvil_ctl.engine.runner import Outcome
from anvil_ctl.engine.serving import is_running
from anvil_ctl.engine.world import World


def promote(
    ctx: Context,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None = None,
    dry_run: bool = False,
    accept_drift: DriftAcceptance | None = None,
) -> Outcome:
    ctx.config.slot(slot)
    approved_by = require("--approved-by", check_person, approved_by)
    tx_id = str(uuid.uuid4())
    if not dry_run:
        ctx.world()
        ctx.warm_acceptance()  # the real client imports while guards, snapshot and readmission run
    with mutating(ctx, "promote", tx_id, dry_run=dry_run) as lock:
        return _promote_locked(
            ctx,
            slot=slot,
            approved_by=approved_by,
            candidate=candidate,
            dry_run=dry_run,
            tx_id=tx_id,
            accept_drift=accept_drift,
            lock=lock,
        )


def _promote_locked(
    ctx: Context,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None,
    dry_run: bool,
    tx_id: str,
    accept_drift: DriftAcceptance | None,
    lock: HostLock | None,
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
    decision = standing_decision(ctx.store, cand.qualification_digest)
    args = PromoteArgs(
        slot=slot,
        candidate=cand,
        incumbent=ctx.store.current_identity(slot, "incumbent"),
        decision_id=decision["id"] if decision else None,
        approved_by=approved_by,
        accept_drift=accept_drift,
    )
    return run_plan(ctx, "promote", args, dry_run=dry_run, tx_id=tx_id, lock=lock)


def _check_to(ref: str) -> str:
    if len(ref) < 8 and not any(c in ref for c in "-._"):
        raise BadInput(f"--to {ref!r}: give at least 8 characters of a container ID or digest", field="to")
    return ref


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
    if to:
        _check_to(to)
    members: tuple[str, ...] | None = None
    if restore_group is not None:
        if restore_group not in ctx.config.restore_groups:
            raise BadInput(
                f"--restore-group {restore_group!r}: not in the host config's restore_groups "
                f"({sorted(ctx.config.restore_groups)})",
                field="restore_group",
            )
        members = tuple(ctx.config.restore_groups[restore_group])
    tx_id = str(uuid.uuid4())
    with mutating(ctx, "rollback", tx_id, dry_run=dry_run) as lock:
        return _rollback_locked(
            ctx,
            slot=slot,
            to=to,
            restore_group=restore_group,
            members=members,
            dry_run=dry_run,
            tx_id=tx_id,
            lock=lock,
        )


def _rollback_locked(
    ctx: Context,
    *,
    slot: str,
    to: str | None,
    restore_group: str | None,
    members: tuple[str, ...] | None,
    dry_run: bool,
    tx_id: str,
    lock: HostLock | None,
) -> Outcome:
    world = ctx.world()
    target: Identity | None
    if to:
        target = ctx.store.identity_by_ref(slot, to)
        if target is None:
            raise BadInput(f"--to {to!r}: no recorded identity of slot {slot} matches", field="to")
    else:
        # After a load the incumbent is stopped: restore it. After a promote the incumbent
        # serves: go back to the recorded rollback identity.
        incumbent = ctx.store.current_identity(slot, "incumbent")
        serving_incumbent = incumbent is not None and is_running(world, incumbent.container_id)
        target = ctx.store.current_identity(slot, "rollback") if serving_incumbent else incumbent
    current, role = _serving_now(ctx, world, slot, target)
    args = RollbackArgs(
        slot=slot,
        target=target,
        current=current,
        current_role=role,
        current_routed=role == "incumbent",
        restore_group=restore_group,
        restore_group_members=members,
        recorded_snapshot=recorded_snapshot(ctx, target) if target else None,
    )
    return run_plan(ctx, "rollback", args, dry_run=dry_run, tx_id=tx_id, lock=lock)


def _serving_now(
    ctx: Context, world: World, slot: str, target: Identity | None
) -> tuple[Identity | None, str]:
    """What serves the slot now (to be stopped and retained), and its recorded role."""
    for role in ("incumbent", "candidate"):
        ident = ctx.store.current_identity(slot, role)
        if (
            ident
            and (target is None or ident.container_id != target.container_id)
            and is_running(world, ident.container_id)
        ):
            return ident, role
    return None, ""
