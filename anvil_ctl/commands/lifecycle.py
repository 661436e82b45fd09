"""promote and rollback/restore: the parsed command as a request for the engine's entry."""

from __future__ import annotations

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.transactions import enter, limit_waits
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import DrainPolicy, OnDrainTimeout
from anvil_ctl.core.validate import check_person, require
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import DriftAcceptance, PromoteRequest, RollbackRequest


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
    if not dry_run:
        # First: the real client imports while the world is built, and while guards,
        # snapshot and readmission run; the child holds none of the world's connections.
        app.warm_acceptance()
    request = PromoteRequest(
        slot=slot, approved_by=approved_by, candidate=candidate, accept_drift=accept_drift
    )
    return enter(app, request, dry_run=dry_run)


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
    request = RollbackRequest(
        slot=slot,
        to=to,
        restore_group=restore_group,
        restore_group_members=members,
        decided_by=decided_by,
        drain=DrainPolicy.of(drain_timeout_s, on_drain_timeout, default="cut"),
    )
    return enter(app, request, dry_run=dry_run)
