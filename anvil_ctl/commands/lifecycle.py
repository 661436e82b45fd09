"""promote (and the abort of a watched one) and rollback/restore: the parsed command as a
request for the engine's entry."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.transactions import enter, limit_waits
from anvil_ctl.core.errors import AnvilError, BadInput, Refused
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_RECIPE, DrainPolicy, OnDrainTimeout
from anvil_ctl.core.states import TxState
from anvil_ctl.core.validate import check_duration, check_person, check_text, require
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import CanaryRequest, DriftAcceptance, PromoteRequest, RollbackRequest


def promote(
    app: App,
    *,
    slot: str,
    approved_by: str,
    candidate: str | None = None,
    dry_run: bool = False,
    accept_drift: DriftAcceptance | None = None,
    timeout_s: float | None = None,
    watch_s: float | None = None,
) -> Outcome:
    """Route the slot to its candidate; `watch_s` watches it that long after the switch
    (0: a cutover; None: the `[watch]` duration of the profile that qualified it)."""
    app.config.slot(slot)
    approved_by = require("--approved-by", check_person, approved_by)
    if not dry_run:
        # First: the real client imports while the world is built, and while guards,
        # snapshot and readmission run; the child holds none of the world's connections.
        app.warm_acceptance()
    limit_waits(app, timeout_s)  # builds the world: after the fork
    request = PromoteRequest(
        slot=slot, approved_by=approved_by, candidate=candidate, accept_drift=accept_drift, watch_s=watch_s
    )
    return enter(app, request, dry_run=dry_run)


def abort_watch(app: App, *, slot: str, by: str, reason: str, wait_s: float = 120.0) -> JSONObject:
    """A person stops the watch of the slot's promote (run from another shell): the abort is
    journaled in the watched transaction, whose owner rolls back at its next check. Waits up
    to `wait_s` for the promote to end and names its rollback; Refused when nothing watches."""
    app.config.slot(slot)
    by = require("--by", check_person, by)
    reason = require("--reason", lambda r: check_text(r, empty=False), reason)
    found = [r for r in app.store.unfinished() if r.kind == "promote" and r.slot == slot]
    begun = [
        (r, e.seq)
        for r in found
        for e in app.store.step_events(r.id)
        if e.step == "watch" and e.event == "begin"
    ]
    if not begun:
        what = f"promote {found[0].id} is {found[0].state.value}, not watching" if found else "no promote"
        raise Refused(f"slot {slot}: {what}; nothing to abort", slot=slot)
    from anvil_ctl.engine.watch import ABORT  # the watch loads the qualify library: only here

    rec, seq = begun[0]
    at = datetime.now(UTC).isoformat()
    app.store.step_event(
        rec.id,
        seq=seq,
        step="watch",
        phase="watch",
        event=ABORT,
        detail={"by": by, "reason": reason, "at": at},
    )
    deadline = time.monotonic() + wait_s
    state = app.store.state(rec.id)
    while state in (TxState.WATCHING, TxState.RUNNING) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = app.store.state(rec.id)
    detail = app.store.record(rec.id)
    out: JSONObject = {"promote": rec.id, "state": state.value, "aborted_by": by}
    if state is TxState.ROLLED_BACK:
        from anvil_ctl.persistence import queries

        states = queries.transaction_detail(app.store, rec.id)["states"]
        data = states[-1]["data"] if states else None
        follow = data.get("followed_by") if isinstance(data, dict) else None
        out["rollback"] = str(follow.get("tx_id")) if isinstance(follow, dict) else None
    elif state in (TxState.WATCHING, TxState.INTERRUPTED):
        out["note"] = (
            f"the promote (pid {detail.owner.pid}) has not ended yet; `anvilctl recover` resumes a "
            "watch whose owner is gone, and rolls back at once for this abort"
        )
    return out


def canary(
    app: App,
    *,
    slot: str,
    approved_by: str,
    shares: str,
    step_watch_s: float,
    profile: str | None = None,
    dry_run: bool = False,
    timeout_s: float | None = None,
) -> Outcome:
    """`promote --canary`: the slot's candidate beside the incumbent its tier serves, its share
    stepped up, each step watched for `step_watch_s` (`anvil_ctl.engine.plans.canary`)."""
    from anvil_ctl.engine.serving import tier_incumbent
    from anvil_ctl.qualify.canary import parse_shares

    app.config.slot(slot)
    approved_by = require("--approved-by", check_person, approved_by)
    steps = parse_shares(shares)
    step_watch_s = require("--step-watch", check_duration, step_watch_s)
    if not dry_run:
        app.warm_acceptance()  # as promote does: before the world, so the child holds none of it
    limit_waits(app, timeout_s)
    world = app.world()
    cand = world.store.current_identity(slot, "candidate")
    inc = tier_incumbent(world, slot)
    request = CanaryRequest(
        slot=slot,
        approved_by=approved_by,
        shares=steps,
        step_watch_s=step_watch_s,
        profile=profile,
        vram_need_mib=(_vram_need(app, inc), _vram_need(app, cand)),
    )
    return enter(app, request, dry_run=dry_run)


def _vram_need(app: App, ident: Identity | None) -> int | None:
    """The VRAM need per card of the recipe a serve was loaded from (its container's label);
    None when that recipe is not found (an adopted serve has none)."""
    from anvil_ctl.commands import recipes
    from anvil_ctl.recipes.model import load_recipe

    if ident is None or not ident.gpu_roles:
        return 0 if ident is not None else None
    try:
        name = app.world().runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE, "")
        recipe = load_recipe(recipes.resolve_recipe_path(name, recipes.recipe_search(app))) if name else None
    except AnvilError:
        return None
    return recipe.vram_need_mib if recipe is not None else None


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
