"""Commands that run transactions: adopt, load, recover; and the lock commands.

Each takes the command App, holds the host lock for its whole life, and
returns an Outcome (or a report) for the CLI to render.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TypedDict

from anvil_ctl.bootstrap import App
from anvil_ctl.core.engine_profile import ENGINE_PROFILES, engine_profile
from anvil_ctl.core.errors import BadInput, NotFound
from anvil_ctl.core.identity import Identity
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
from anvil_ctl.engine.lock import HostLock, held_locks
from anvil_ctl.engine.observe import serving
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans import KINDS
from anvil_ctl.engine.plans.args import AdoptArgs, Candidate, DriftAcceptance, LoadArgs, PlanArgs
from anvil_ctl.engine.recover import RecoverReport, recover
from anvil_ctl.engine.runner import TransactionEngine
from anvil_ctl.engine.served_context import observe_context
from anvil_ctl.engine.serving import is_running
from anvil_ctl.persistence.locks import release_row


def run_plan(
    app: App,
    kind: str,
    args: PlanArgs,
    *,
    dry_run: bool,
    tx_id: str | None = None,
    lock: HostLock | None = None,
) -> Outcome:
    """Run a transaction; `lock` when the caller already holds the host lock (see `mutating`),
    whose row is claimed here, once the plan is built from arguments that passed every check."""
    world = app.world()
    plan = KINDS[kind].build(args, world)
    engine = TransactionEngine(app.store, app.owner, faults=app.faults)
    if dry_run:
        return engine.run(plan, world, dry_run=True)
    tx_id = tx_id or str(uuid.uuid4())
    if lock is not None:
        # The row is claimed with the transaction's first row and released with its end state
        # (`TransactionEngine.run`); an error before an end state leaves it for `recover`.
        return engine.run(plan, world, tx_id=tx_id, opening=lock.claim, closing=lock.release_row)
    if not plan.mutates:
        return engine.run(plan, world, tx_id=tx_id)
    with HostLock(app.store, app.settings.lock_path, app.owner, kind, tx_id):
        return engine.run(plan, world, tx_id=tx_id)


def limit_waits(app: App, timeout_s: float | None) -> None:
    """`--timeout`: no forward wait of this command's transaction (health, VRAM release,
    readmission) lasts longer than `timeout_s`; compensation keeps the configured deadlines."""
    if timeout_s is None:
        return
    app.world().wait_limit_s = require("--timeout", check_duration, timeout_s)


@contextmanager
def mutating(app: App, kind: str, tx_id: str, *, dry_run: bool) -> Iterator[HostLock | None]:
    """Hold the host's OS lock while a command reads the state its arguments are built from:
    identities read before the lock could be stale by the time the transaction runs. The
    lock row is claimed by `run_plan`, so bad input found here (exit 2) writes nothing.
    A dry run changes nothing and takes no lock (None)."""
    if dry_run:
        yield None
        return
    lock = HostLock(app.store, app.settings.lock_path, app.owner, kind, tx_id)
    lock.acquire(claim=False)
    try:
        yield lock
    except BaseException as exc:
        lock.__exit__(type(exc), exc, exc.__traceback__)
        raise
    lock.release()


def adopt(
    app: App,
    *,
    slot: str,
    container_id: str,
    context_tokens: int,
    dry_run: bool = False,
    recipe_digest: str = "",
    model_identity: str = "",
    gpu_roles: tuple[str, ...] = (),
    engine: str = "",
) -> Outcome:
    """Record a serving container (started by hand or another tool) as the slot's incumbent.

    `engine` names its engine profile (how it is probed from now on: health route, where
    its context shows); empty: the OpenAI-compatible assumptions.
    """
    context_tokens = require(
        "--context-tokens", lambda n: check_int(n, lo=1, hi=MAX_CONTEXT_TOKENS), context_tokens
    )
    if engine and engine not in ENGINE_PROFILES:
        raise BadInput(f"--engine {engine!r}: expected one of {sorted(ENGINE_PROFILES)}", field="engine")
    profile = engine_profile(engine)
    world = app.world()
    slot_cfg = app.config.slot(slot)
    try:
        info = world.runtime.inspect(container_id)
    except NotFound:
        raise BadInput(f"container {container_id}: not found", field="container_id") from None
    observed = serving(world, slot_cfg.base_url, profile.health_path)
    models = [m for m, _ in observed["models"]]
    if not info.running or len(models) != 1 or not observed["healthy"]:
        raise BadInput(
            f"container {container_id[:12]} must be running and {slot_cfg.binding} must serve one model "
            f"healthy (observed status {info.status}, models {models}, healthy {observed['healthy']}; "
            f"engine profile {profile.name})",
            field="container_id",
        )
    seen = observe_context(world, profile, slot_cfg.base_url, models[0], context_tokens)
    if not seen.matches(context_tokens):
        # Recording a context the engine does not serve would make every recheck report drift.
        raise BadInput(
            f"--context-tokens {context_tokens}: {slot_cfg.binding} {seen.describe()} "
            f"(engine profile {profile.name})",
            field="context_tokens",
        )
    image = world.runtime.image(info.image_id)
    ident = Identity(
        slot=slot,
        container_id=info.id,
        image_id=info.image_id,
        config_fingerprint=info.fingerprint,
        served_model=models[0],
        context_tokens=context_tokens,
        binding=slot_cfg.binding,
        router_tier=slot_cfg.router_tier,
        recipe_digest=recipe_digest,
        model_identity=model_identity,
        repo_digests=image.repo_digests,
        gpu_roles=gpu_roles or slot_cfg.gpu_roles,
        aliases=slot_cfg.aliases,
        container_name=info.name,
        engine_profile=engine,
    )
    return run_plan(app, "adopt", AdoptArgs(slot=slot, identity=ident), dry_run=dry_run)


def load(
    app: App,
    *,
    slot: str,
    candidate: Candidate,
    dry_run: bool = False,
    tx_id: str | None = None,
    accept_drift: DriftAcceptance | None = None,
    drain: DrainPolicy | None = None,
) -> Outcome:
    world = app.world()
    app.config.slot(slot)
    tx_id = tx_id or str(uuid.uuid4())
    with mutating(app, "load", tx_id, dry_run=dry_run) as lock:
        incumbent = app.store.current_identity(slot, "incumbent")
        args = LoadArgs(
            slot=slot,
            candidate=candidate,
            incumbent=incumbent,
            incumbent_running=incumbent is not None and is_running(world, incumbent.container_id),
            accept_drift=accept_drift,
            drain=drain or REFUSE_TO_CUT,
        )
        return run_plan(app, "load", args, dry_run=dry_run, tx_id=tx_id, lock=lock)


def recover_all(app: App) -> RecoverReport:
    world = app.world()
    lock = HostLock(app.store, app.settings.lock_path, app.owner, "recover")
    stale = lock.acquire(take_over_dead=True)
    try:
        report = recover(app.store, app.owner, world, faults=app.faults)
        # A dead owner's lock row goes only once nothing it left is unresolved: not after this
        # run's failures, and not while an earlier run's transaction still waits for a person.
        left = {(r.owner.pid, r.owner.hostname, r.owner.boot_id) for r in app.store.unresolved()}
        for dead in stale:
            if (dead.pid, dead.host, dead.boot_id) in left:
                report.skipped.append({"lock_id": dead.id, "why": "its owner left unresolved transactions"})
                continue
            release_row(app.store, dead.id, how="recovered", by=f"recover pid {app.owner.pid}")
            report.released_locks.append(dead.as_dict())
    finally:
        lock.release()
    return report


def lock_status(app: App) -> list[Mapping[str, object]]:
    """Every lock row without a release, newest first (`LockInfo.as_dict()`)."""
    return [h.as_dict() for h in held_locks(app.store, app.owner)]


class LockBroken(TypedDict):
    lock_id: str
    broken: bool
    was: Mapping[str, object]  # the lock row as `lock status` showed it


def lock_break(app: App, lock_id: str, *, by: str, reason: str) -> LockBroken:
    """Release a lock row by its exact ID (journaled); refuses a live local owner."""
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
