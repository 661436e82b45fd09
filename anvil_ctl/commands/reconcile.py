"""`reconcile`: re-apply a slot's recorded route (after a router restart or a late removal)."""

from __future__ import annotations

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.transactions import enter
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import ReconcileRequest


def reconcile(app: App, slot: str, *, dry_run: bool = False) -> Outcome:
    """Route the slot's tier to the serve its record publishes (its incumbent), if it does not already."""
    return enter(app, ReconcileRequest(slot=slot), dry_run=dry_run)
