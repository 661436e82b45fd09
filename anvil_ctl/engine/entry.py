"""The one way into every transaction, `recover` and follow-ups included: a typed request in,
an `Outcome` out, and the only place a transaction ID is made (`_mint`).

A kind that changes the host takes the OS lock before `prepare` reads the record, so its
arguments cannot go stale; the lock's row commits with the journaled arguments and is released
with the end state. A follow-up runs through this same door without letting go of the OS lock.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.ports import Owner
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.campaign import Chain, bring_back, finished, open_chains
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.engine.outcome import FollowUp, Outcome
from anvil_ctl.engine.plans import KINDS
from anvil_ctl.engine.plans.args import LoadRequest, Request, to_json
from anvil_ctl.engine.recover import RecoverReport, recover_unfinished, refuse_without_credentials
from anvil_ctl.engine.runner import NO_FAULTS, Faults, TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.persistence.locks import release_row


def _mint() -> str:
    """A new transaction ID: the only place one is made."""
    return str(uuid.uuid4())


def run(
    world: World,
    owner: Owner,
    request: Request,
    *,
    dry_run: bool = False,
    faults: Faults = NO_FAULTS,
    tx_id: str | None = None,
    held: HostLock | None = None,
) -> Outcome:
    """Prepare, journal and run the transaction `request` asks for. A dry run checks every guard
    and writes nothing; `tx_id` and `held` (the OS lock) are a follow-up's, given by this module."""
    kind = KINDS[request.kind]
    if held is None:
        world.kept_reading = None  # a reading is kept only for a transaction that follows at once
    if dry_run:
        plan = kind.build(kind.prepare(world, request), world, request)
        return TransactionEngine(world.store, faults=faults).dry_run(plan, world)
    tx_id = tx_id or _mint()
    lock = held
    if lock is not None:
        lock.command, lock.tx_id = request.kind, tx_id
    elif kind.mutates:
        lock = HostLock(world.store, world.settings.lock_path, owner, request.kind, tx_id)
        lock.acquire(claim=False)
    try:
        args = kind.prepare(world, request)
        plan = kind.build(args, world, request)
        with world.store.together():  # the lock's row and the transaction's first: one commit
            if lock is not None:
                lock.claim()
            world.store.begin(kind=plan.kind, slot=plan.slot, args=to_json(args), owner=owner, tx_id=tx_id)
        then = request.then if isinstance(request, LoadRequest) else None
        engine = TransactionEngine(world.store, faults=faults, mint=_mint, keep_reading=then is not None)
        outcome = engine.run(plan, world, tx_id)
        engine.commit(lock.release_row if lock is not None else None)  # with the end state
        if outcome.follow_up is not None:
            outcome.followed_by = _follow(world, owner, outcome.follow_up, faults, lock)
        elif then is not None and outcome.state is TxState.COMMITTED:
            outcome.then = run(world, owner, replace(then, chain=tx_id), faults=faults, held=lock)
        world.kept_reading = None
    except BaseException as exc:
        if lock is not None and held is None:  # a held lock is its holder's to release
            lock.release_after(exc)
        raise
    if lock is not None and held is None:
        lock.release()
    outcome.memo = plan.memo
    return outcome


def _follow(world: World, owner: Owner, then: FollowUp, faults: Faults, lock: HostLock | None) -> Outcome:
    if not isinstance(then.request, Request):
        raise TypeError(f"a follow-up is a request, got {type(then.request).__name__}")
    return run(world, owner, then.request, faults=faults, tx_id=then.tx_id, held=lock)


def recover(world: World, owner: Owner, *, faults: Faults = NO_FAULTS) -> RecoverReport:
    """Finish every transaction whose owner is gone (`anvil_ctl.engine.recover`), under the lock."""
    lock = HostLock(world.store, world.settings.lock_path, owner, "recover")
    stale = lock.acquire(take_over_dead=True, claim=False)
    try:
        chains = [f"load --promote {c.load_tx[:8]}" for c in open_chains(world, owner)]
        refuse_without_credentials(owner, world, also=chains)  # before the lock's row
        lock.claim()
        report = recover_unfinished(owner, world, faults=faults, mint=_mint)
        # A dead owner's lock row goes only once nothing it left is unresolved: not after this
        # run's failures, and not while an earlier run's transaction still waits for a person.
        left = {(r.owner.pid, r.owner.hostname, r.owner.boot_id) for r in world.store.unresolved()}
        for dead in stale:
            if (dead.pid, dead.host, dead.boot_id) in left:
                report.skipped.append({"lock_id": dead.id, "why": "its owner left unresolved transactions"})
                continue
            release_row(world.store, dead.id, how="recovered", by=f"recover pid {owner.pid}")
            report.released_locks.append(dead.as_dict())
        for then in report.follow_ups:
            lock.release_row()  # the OS lock stays held: the follow-up claims a row of its own
            report.recovered.append(_reported(_follow(world, owner, then, faults, lock)))
        for chain in open_chains(world, owner):  # after the loads this run rolled forward
            report.recovered += _finish_chain(world, owner, chain, faults, lock)
    finally:
        lock.release()
    return report


def _finish_chain(
    world: World, owner: Owner, chain: Chain, faults: Faults, lock: HostLock
) -> list[JSONObject]:
    """Run an interrupted chain's promotion; when it does not commit, bring the load's incumbent back."""
    lock.release_row()  # the OS lock stays held: each follow-up claims a row of its own
    world.kept_reading = None  # nothing kept from this run: the promotion looks afresh
    promoted, why = chain.promoted, ""
    if promoted is None:  # else an earlier recover ran it, and died bringing the incumbent back
        try:
            promoted = _follow(world, owner, FollowUp(chain.promote, _mint()), faults, lock)
        except AnvilError as exc:  # found wrong by its prepare: nothing journaled
            why = f"{type(exc).__name__}: {exc}"
    found = [finished(chain, promoted, why)]
    back = bring_back(chain, promoted, why, by=f"recover pid {owner.pid}")
    if back is not None:
        lock.release_row()
        after = _follow(world, owner, FollowUp(back, _mint()), faults, lock)
        # `dark`: no serve came back, a person's now
        found.append({**_reported(after), "dark": after.state is not TxState.COMMITTED})
    return found


def _reported(after: Outcome) -> JSONObject:
    return {"tx_id": after.tx_id, "kind": after.kind, "state": after.state.value, "reason": after.reason}
