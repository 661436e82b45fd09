"""promote and rollback/restore: gather the identities, decision and recorded snapshot, then run."""

from __future__ import annotations

import uuid

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.transactions import limit_waits, mutating, run_plan
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import DrainPolicy, OnDrainTimeout
from anvil_ctl.core.validate import check_person, require
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import DriftAcceptance, PromoteArgs, RollbackArgs
from anvil_ctl.engine.plans.promote import standing_decision
from anvil_ctl.engine.serving import is_running
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import queries
from anvil_ctl.persistence.queries import Revision


def promote(
    app: App,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None = None,
    dry_run: bool = False,
    accept_drift: DriftAcceptance | None = None,
    timeout_s: float | None = None,
) -> Outcome:
    app.config.slot(slot)
    approved_by = require("--approved-by", check_person, approved_by)
    limit_waits(app, timeout_s)
    tx_id = str(uuid.uuid4())
    if not dry_run:
        # First: the real client imports while the world is built, and while guards,
        # snapshot and readmission run; the child holds none of the world's connections.
        app.warm_acceptance()
        app.world()
    with mutating(app, "promote", tx_id, dry_run=dry_run) as lock:
        return _promote_locked(
            app,
            slot=slot,
            approved_by=approved_by,
            candidate=candidate,
            dry_run=dry_run,
            tx_id=tx_id,
            accept_drift=accept_drift,
            lock=lock,
        )


def _promote_locked(
    app: App,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None,
    dry_run: bool,
    tx_id: str,
    accept_drift: DriftAcceptance | None,
    lock: HostLock | None,
) -> Outcome:
    cand = app.store.current_identity(slot, "candidate")
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
    decision = standing_decision(app.store, cand.qualification_digest)
    args = PromoteArgs(
        slot=slot,
        candidate=cand,
        incumbent=app.store.current_identity(slot, "incumbent"),
        decision_id=str(decision["id"]) if decision else None,
        approved_by=approved_by,
        accept_drift=accept_drift,
    )
    return run_plan(app, "promote", args, dry_run=dry_run, tx_id=tx_id, lock=lock)


def _check_to(ref: str) -> str:
    if is_revision(ref):
        return ref
    if len(ref) < 8 and not any(c in ref for c in "-._"):
        raise BadInput(
            f"--to {ref!r}: expected a revision number (audit history), or at least 8 characters "
            "of a transaction ID, container ID or identity digest, or a served model",
            field="to",
        )
    return ref


def is_revision(ref: str) -> bool:
    """A revision number of `audit history` (`3`); IDs are given with 8 characters or more."""
    return ref.isdigit() and len(ref) < 8


def resolve_to(app: App, slot: str, ref: str) -> Identity:
    """What `rollback --to REF` brings back: the serve a revision left (`audit history --slot`),
    the serve a transaction left (ID or prefix), or a recorded identity by container ID,
    identity digest or served model. A prefix naming two different serves is refused."""
    if is_revision(ref):
        count, revisions = queries.slot_revisions(app.store, slot, app.store.host, number=int(ref))
        if not revisions:
            raise BadInput(f"--to {ref}: slot {slot} has revisions 1..{count}", field="to")
        (rev,) = revisions
        if rev["serve"] is None:
            raise BadInput(
                f"--to {ref}: revision {ref} ({rev['kind']}, {rev['state']}) left no serve to bring "
                "back; expected a committed adopt, load, promote or rollback",
                field="to",
            )
        return _identity(app, rev, f"revision {ref}")
    by_tx = queries.slot_revisions_of(app.store, slot, app.store.host, ref)
    by_ref = app.store.identity_by_ref(slot, ref)
    if len(by_tx) > 1:
        raise BadInput(f"--to {ref!r}: names transactions {[r['tx_id'] for r in by_tx]}", field="to")
    if by_tx:
        rev = by_tx[0]
        if rev["serve"] is None:
            raise BadInput(
                f"--to {ref!r}: transaction {rev['tx_id']} ({rev['kind']}, {rev['state']}) left no "
                "serve to bring back",
                field="to",
            )
        found = _identity(app, rev, f"transaction {rev['tx_id']}")
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


def _identity(app: App, rev: Revision, what: str) -> Identity:
    """The serve revision `rev` left, read through its transaction's identity rows (a search:
    by its digest, the newest identity naming it was a walk back to it, 0.45 s for revision 3 at
    100k transactions)."""
    serve = rev["serve"]
    found = app.store.identity_of(rev["tx_id"], serve["role"]) if serve is not None else None
    if found is None:  # the identity row came from the same history: only a cut record gets here
        raise BadInput(f"--to: the identity {what} recorded is not in the record", field="to")
    return found


def recorded_snapshot(app: App, target: Identity) -> str | None:
    """The SHA-256 of the newest recorded snapshot in which `target` served the slot as its
    incumbent (the plan reads its body from the record).

    Serving means: recorded as the slot's incumbent, its container running, and the
    binding answering with its served model. Snapshots taken while it was stopped
    (a campaign of several loads) do not count.
    """
    found = app.store.served_snapshot(target)
    return found[0] if found else None


def rollback(
    app: App,
    *,
    slot: str,
    to: str | None = None,
    restore_group: str | None = None,
    dry_run: bool = False,
    timeout_s: float | None = None,
    decided_by: JSONObject | None = None,
    drain_timeout_s: float | None = None,
    on_drain_timeout: OnDrainTimeout | None = None,
) -> Outcome:
    """Bring back a recorded serve; `decided_by` names the policy when no person asked. What
    serves now is drained first; at the drain's deadline (`drain_timeout_s`) the rollback goes
    on and counts the answers it cut (`on_drain_timeout` abort: it gives up instead)."""
    app.config.slot(slot)
    if to:
        _check_to(to)
    limit_waits(app, timeout_s)
    members: tuple[str, ...] | None = None
    if restore_group is not None:
        if restore_group not in app.config.restore_groups:
            raise BadInput(
                f"--restore-group {restore_group!r}: not in the host config's restore_groups "
                f"({sorted(app.config.restore_groups)})",
                field="restore_group",
            )
        members = tuple(app.config.restore_groups[restore_group])
    tx_id = str(uuid.uuid4())
    with mutating(app, "rollback", tx_id, dry_run=dry_run) as lock:
        return _rollback_locked(
            app,
            slot=slot,
            to=to,
            restore_group=restore_group,
            members=members,
            dry_run=dry_run,
            decided_by=decided_by,
            tx_id=tx_id,
            lock=lock,
            drain=DrainPolicy.of(drain_timeout_s, on_drain_timeout, default="cut"),
        )


def _rollback_locked(
    app: App,
    *,
    slot: str,
    to: str | None,
    restore_group: str | None,
    members: tuple[str, ...] | None,
    dry_run: bool,
    tx_id: str,
    lock: HostLock | None,
    decided_by: JSONObject | None = None,
    drain: DrainPolicy,
) -> Outcome:
    world = app.world()
    target: Identity | None
    if to:
        target = resolve_to(app, slot, to)
    else:
        # After a load the incumbent is stopped: restore it. After a promote the incumbent
        # serves: go back to the recorded rollback identity.
        incumbent = app.store.current_identity(slot, "incumbent")
        serving_incumbent = incumbent is not None and is_running(world, incumbent.container_id)
        target = app.store.current_identity(slot, "rollback") if serving_incumbent else incumbent
    current, role = _serving_now(app, world, slot, target)
    args = RollbackArgs(
        slot=slot,
        target=target,
        current=current,
        current_role=role,
        current_routed=role == "incumbent",
        restore_group=restore_group,
        restore_group_members=members,
        recorded_sha256=recorded_snapshot(app, target) if target else None,
        decided_by=decided_by,
        drain=drain,
    )
    return run_plan(app, "rollback", args, dry_run=dry_run, tx_id=tx_id, lock=lock)


def _serving_now(app: App, world: World, slot: str, target: Identity | None) -> tuple[Identity | None, str]:
    """What serves the slot now (to be stopped and retained), and its recorded role."""
    for role in ("incumbent", "candidate"):
        ident = app.store.current_identity(slot, role)
        if (
            ident
            and (target is None or ident.container_id != target.container_id)
            and is_running(world, ident.container_id)
        ):
            return ident, role
    return None, ""
