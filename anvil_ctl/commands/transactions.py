"""Commands that run transactions (adopt, load, reconcile, recover) and the lock commands.

Each translates its parsed arguments into a request for the engine's one entry
(`anvil_ctl.engine.entry`) and returns an Outcome (or a report) for the CLI to render.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from anvil_ctl.bootstrap import App
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import REFUSE_TO_CUT, DrainPolicy
from anvil_ctl.core.states import WAITING_STATES, TxState
from anvil_ctl.core.validate import (
    MAX_CONTEXT_TOKENS,
    check_duration,
    check_int,
    check_person,
    check_text,
    require,
)
from anvil_ctl.engine import entry
from anvil_ctl.engine.lock import held_locks
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import (
    AdoptRequest,
    Candidate,
    DriftAcceptance,
    LoadRequest,
    PromoteRequest,
    ReconcileRequest,
    Request,
)
from anvil_ctl.engine.recover import RecoverReport
from anvil_ctl.persistence.locks import release_row


def enter(app: App, request: Request, *, dry_run: bool = False) -> Outcome:
    """Run `request` through the engine's one entry with this command's world and owner."""
    return entry.run(app.world(), app.owner, request, dry_run=dry_run, faults=app.faults)


def limit_waits(app: App, timeout_s: float | None) -> None:
    """`--timeout`: no forward wait of this command's transaction (health, VRAM release,
    readmission) lasts longer than `timeout_s`; compensation keeps the configured deadlines."""
    if timeout_s is None:
        return
    app.world().wait_limit_s = require("--timeout", check_duration, timeout_s)


def adopt(
    app: App,
    *,
    slot: str,
    container_id: str,
    context_tokens: int,
    dry_run: bool = False,
    engine: str = "",
) -> Outcome:
    """Record a serving container (started by hand or another tool) as the slot's incumbent;
    `engine` names its engine profile (empty: the OpenAI-compatible assumptions)."""
    context_tokens = require(
        "--context-tokens", lambda n: check_int(n, lo=1, hi=MAX_CONTEXT_TOKENS), context_tokens
    )
    request = AdoptRequest(
        slot=slot,
        container_id=container_id,
        context_tokens=context_tokens,
        engine=engine,
    )
    return enter(app, request, dry_run=dry_run)


def load(
    app: App,
    *,
    slot: str,
    candidate: Candidate,
    dry_run: bool = False,
    accept_drift: DriftAcceptance | None = None,
    drain: DrainPolicy | None = None,
    then: PromoteRequest | None = None,
) -> Outcome:
    request = LoadRequest(
        slot=slot, candidate=candidate, accept_drift=accept_drift, drain=drain or REFUSE_TO_CUT, then=then
    )
    return enter(app, request, dry_run=dry_run)


def reconcile(app: App, slot: str, *, dry_run: bool = False) -> Outcome:
    """Route the slot's tier to the serve its record publishes (its incumbent), if it does not
    already (after a router restart or a late removal)."""
    return enter(app, ReconcileRequest(slot=slot), dry_run=dry_run)


def recover_all(app: App) -> RecoverReport:
    return entry.recover(app.world(), app.owner, faults=app.faults)


def lock_status(app: App) -> list[Mapping[str, object]]:
    """Every lock row without a release, newest first (`LockInfo.as_dict()`)."""
    return [h.as_dict() for h in held_locks(app.store, app.owner)]


def lock_break(app: App, lock_id: str, *, by: str, reason: str) -> dict[str, object]:
    """Release a lock row by its exact ID (journaled); refuses a live local owner. Says the
    lock row as `lock status` showed it (`was`)."""
    by = require("--by", check_person, by)
    reason = require("--reason", lambda r: check_text(r, empty=False), reason)
    for h in held_locks(app.store, app.owner):
        if h.id == lock_id:
            if h.alive:
                raise BadInput(f"{h.describe()}: the owner is alive; stop it instead", field="lock_id")
            release_row(app.store, lock_id, how="broken", by=by, reason=reason)
            return {"lock_id": lock_id, "broken": True, "was": h.as_dict()}
    raise BadInput(f"lock {lock_id} is not held", field="lock_id")


# What `resolve` did: the transaction moved from its waiting state to compensated, and by whom.
Resolved = TypedDict("Resolved", {"tx_id": str, "from": str, "to": str, "resolved_by": str})


def resolve(app: App, tx: str, *, by: str, note: str) -> Resolved:
    """A person records that they resolved a transaction that waits for one."""
    by = require("--by", check_person, by)
    note = require("--note", lambda n: check_text(n, multiline=True, empty=False), note)
    matches = [r for r in app.store.unresolved() if r.id.startswith(tx)]
    if len(matches) != 1:
        raise BadInput(f"transaction {tx!r}: no unique unresolved transaction matches", field="transaction")
    rec = matches[0]
    if rec.state not in WAITING_STATES:
        raise BadInput(
            f"transaction {rec.id[:8]} is {rec.state.value}: `anvilctl recover` handles it, not a person",
            field="transaction",
        )
    app.store.transition(rec.id, TxState.COMPENSATED, f"resolved by {by}: {note}", {"resolved_by": by})
    return {"tx_id": rec.id, "from": rec.state.value, "to": "compensated", "resolved_by": by}
