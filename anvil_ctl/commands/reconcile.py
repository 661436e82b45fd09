"""`reconcile`: re-apply a slot's recorded route (after a router restart or a late removal).

Holds the host lock from reading the record to the end of the transaction, like
every mutating command: the serve read before the lock could be stale by then.
"""

from __future__ import annotations

import uuid

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.transactions import mutating, run_plan
from anvil_ctl.core.errors import BadInput
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import ReconcileArgs


def reconcile(app: App, slot: str, *, dry_run: bool = False) -> Outcome:
    """Route the slot's tier to the serve its record publishes (its incumbent), if it does not already."""
    app.config.slot(slot)
    tx_id = str(uuid.uuid4())
    with mutating(app, "reconcile", tx_id, dry_run=dry_run) as lock:
        serve = app.store.current_identity(slot, "incumbent")
        if serve is None:
            raise BadInput(
                f"slot {slot}: no incumbent is recorded, so no route to re-apply; "
                "adopt the serving container first (`anvilctl adopt`)",
                field="slot",
            )
        args = ReconcileArgs(slot=slot, serve=serve)
        return run_plan(app, "reconcile", args, dry_run=dry_run, tx_id=tx_id, lock=lock)
