"""The one way into every transaction: a typed request in, an `Outcome` out.

`run` is the only place a transaction ID is made. For a kind that changes the host it
takes the host's OS lock before anything is read from the record, so that the arguments
prepared from it cannot go stale before the plan runs. Then the kind's `prepare` turns the
request into typed arguments (every read of the record and the host they need, once);
bad input found there exits having written nothing. The lock's row is claimed in the
database transaction that journals those arguments with the transaction's first row, the
plan runs, and its end state commits together with the row's release. The OS lock is
released on every way out; the row is kept only when the process failed mid-transaction,
so that the next mutator is refused until `recover` has finished what was left.

`recover` enters through the same door: it takes the lock, accepting a dead owner's stale
rows, finishes every transaction whose owner is gone, and releases the stale rows that
nothing unresolved still needs.
"""

from __future__ import annotations

import uuid

from anvil_ctl.core.ports import Owner
from anvil_ctl.engine.faults import NO_FAULTS, Faults
from anvil_ctl.engine.lock import HostLock
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans import KINDS
from anvil_ctl.engine.plans.args import Request, to_json
from anvil_ctl.engine.recover import RecoverReport, recover_unfinished
from anvil_ctl.engine.runner import TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.persistence.locks import release_row


def run(
    world: World, owner: Owner, request: Request, *, dry_run: bool = False, faults: Faults = NO_FAULTS
) -> Outcome:
    """Prepare, journal and run the transaction `request` asks for (see the module doc).

    A dry run prepares and checks every guard, takes no lock and writes nothing.
    """
    kind = KINDS[request.kind]
    if dry_run:
        plan = kind.build(kind.prepare(world, request), world, request)
        return TransactionEngine(world.store, owner, faults=faults).dry_run(plan, world)
    tx_id = str(uuid.uuid4())
    lock = (
        HostLock(world.store, world.settings.lock_path, owner, request.kind, tx_id) if kind.mutates else None
    )
    if lock is not None:
        lock.acquire(claim=False)
    try:
        args = kind.prepare(world, request)
        plan = kind.build(args, world, request)
        with world.store.together():  # the lock's row and the transaction's first: one commit
            if lock is not None:
                lock.claim()
            world.store.begin(kind=plan.kind, slot=plan.slot, args=to_json(args), owner=owner, tx_id=tx_id)
        engine = TransactionEngine(world.store, owner, faults=faults)
        outcome = engine.run(plan, world, tx_id)
        engine.commit(lock.release_row if lock is not None else None)  # with the end state
    except BaseException as exc:
        if lock is not None:
            lock.release_after(exc)
        raise
    if lock is not None:
        lock.release()
    outcome.memo = plan.memo
    return outcome


def recover(world: World, owner: Owner, *, faults: Faults = NO_FAULTS) -> RecoverReport:
    """Finish every transaction whose owner is gone (`anvil_ctl.engine.recover`), under the lock."""
    lock = HostLock(world.store, world.settings.lock_path, owner, "recover")
    stale = lock.acquire(take_over_dead=True)
    try:
        report = recover_unfinished(world.store, owner, world, faults=faults)
        # A dead owner's lock row goes only once nothing it left is unresolved: not after this
        # run's failures, and not while an earlier run's transaction still waits for a person.
        left = {(r.owner.pid, r.owner.hostname, r.owner.boot_id) for r in world.store.unresolved()}
        for dead in stale:
            if (dead.pid, dead.host, dead.boot_id) in left:
                report.skipped.append({"lock_id": dead.id, "why": "its owner left unresolved transactions"})
                continue
            release_row(world.store, dead.id, how="recovered", by=f"recover pid {owner.pid}")
            report.released_locks.append(dead.as_dict())
    finally:
        lock.release()
    return report
