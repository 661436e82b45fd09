"""Recover transactions whose owner is gone: mark them interrupted, then finish them.

Before the pivot's result is journaled, recovery compensates backwards (undos journaled as done
are not run again); after it, it rolls forward from the first step without a result, a watched
promote's watch included. A router that refuses our credentials stops it before it writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from anvil_ctl.core.errors import AnvilError, AuthRejected, NeedsOperator
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.ports import Owner, StepEvent, TxRecord
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.core.steps import Step, StepContext
from anvil_ctl.engine.campaign import DIED_BEFORE_MUTATION
from anvil_ctl.engine.outcome import FollowUp, Outcome
from anvil_ctl.engine.owner import owner_alive
from anvil_ctl.engine.plans import KINDS, AnyPlan
from anvil_ctl.engine.runner import NO_FAULTS, Faults, TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import snapshots

log = get_logger("anvil.recover")

AnyStep = Step[StepContext[object, World, object]]


@dataclass
class RecoverReport:
    recovered: list[JSONObject] = field(default_factory=list)
    skipped: list[JSONObject] = field(default_factory=list)
    released_locks: list[JSONObject] = field(default_factory=list)
    follow_ups: list[FollowUp] = field(default_factory=list)
    """What recovered transactions asked to run next (a resumed watch's rollback), for the entry."""

    @property
    def exit_code(self) -> int:
        done = {
            s.value for s in (TxState.COMPENSATED, TxState.REFUSED, TxState.COMMITTED, TxState.ROLLED_BACK)
        }
        # `dark`: an interrupted `load --promote` whose incumbent could not be brought back
        unresolved = any(r["state"] not in done or r.get("dark") for r in self.recovered)
        return int(ExitCode.NEEDS_OPERATOR if unresolved else 0)

    def as_dict(self) -> JSONObject:
        return {
            "recovered": list(self.recovered),
            "skipped": list(self.skipped),
            "released_locks": list(self.released_locks),
        }


def pending_undos(plan: AnyPlan, events: list[StepEvent]) -> list[tuple[int, AnyStep, JSONObject | None]]:
    """Steps whose do was started and whose undo has not completed, with recorded results; journal
    events match the rebuilt plan by step name and position, and a mismatch goes to a person."""
    started: dict[int, JSONObject | None] = {}
    names: dict[int, str] = {}
    undone: set[int] = set()
    for ev in events:
        if ev.phase == "do" and ev.event == "intent":
            started.setdefault(ev.seq, None)
            names[ev.seq] = ev.step
        elif ev.phase == "do" and ev.event == "result":
            started[ev.seq] = ev.detail
        elif ev.phase == "undo" and ev.event == "result":
            undone.add(ev.seq)
    todo = []
    for seq, result in sorted(started.items()):
        if seq in undone:
            continue
        if seq >= len(plan.steps) or plan.steps[seq].name != names[seq]:
            raise NeedsOperator(
                f"journaled step {seq} {names[seq]!r} does not match the plan rebuilt from today's "
                "config; compensate by hand",
                step=names[seq],
            )
        todo.append((seq, plan.steps[seq], result))
    return todo


def refuse_without_credentials(me: Owner, world: World, *, also: Sequence[str] = ()) -> None:
    """Raise AuthRejected, before anything is written, when there is something to recover (`also`:
    other work waiting) and the router refuses our credentials: every undo would be refused too."""
    if world.router is None:
        return
    # Unfinished transactions whose owner is gone (or is this process), past their guards.
    gone = [rec for rec in world.store.unfinished() if rec.owner == me or owner_alive(rec.owner, me) is False]
    waiting = [rec for rec in gone if rec.state != TxState.PLANNED]
    if not waiting and not also:
        return
    try:
        world.router.probe_credentials()
    except AuthRejected as exc:
        named = ", ".join([*(f"{rec.kind} {rec.id[:8]} ({rec.state.value})" for rec in waiting), *also])
        raise AuthRejected(
            f"recover changed nothing: {exc}; still to recover: {named}; give the router's "
            "credentials and run `anvilctl recover` again",
            **exc.data,
            waiting=[rec.id for rec in waiting],
        ) from None
    except AnvilError as exc:  # a router down is no credential problem: recovery goes on as before
        log.warning("recover: the router did not answer the credential probe", error=str(exc))


def recover_unfinished(
    me: Owner, world: World, *, faults: Faults = NO_FAULTS, mint: Callable[[], str] | None = None
) -> RecoverReport:
    report, journal = RecoverReport(), world.store
    engine = TransactionEngine(journal, faults=faults, mint=mint)
    # The dead owner may have sent removals to the router that no adapter here saw: every
    # readmission of this recovery holds past them (`Readmission.hold`).
    world = replace(world, hold_readmissions=True)
    for rec in journal.unfinished():
        alive = owner_alive(rec.owner, me)
        if alive is not False and rec.owner != me:
            why = "owner alive" if alive else "owner on another host"
            report.skipped.append({"tx_id": rec.id, "kind": rec.kind, "why": why})
            continue
        try:
            found, then = _recover_one(engine, rec, world)
            report.recovered.append(found)
            if then is not None:
                report.follow_ups.append(then)
        except Exception as exc:
            log.error("recover failed", tx_id=rec.id, error=str(exc))
            why = f"recover could not finish it: {type(exc).__name__}: {exc}"
            state = journal.record(rec.id).state
            if state in (TxState.RUNNING, TxState.COMPENSATING, TxState.WATCHING):
                target = TxState.NEEDS_OPERATOR if state == TxState.COMPENSATING else TxState.INTERRUPTED
                journal.transition(rec.id, target, why)
            report.recovered.append(
                {"tx_id": rec.id, "kind": rec.kind, "state": "needs_operator", "reason": why}
            )
    return report


def _undone(events: list[StepEvent]) -> list[str]:
    return [ev.step for ev in events if ev.phase == "undo" and ev.event == "result"]


def _recover_one(
    engine: TransactionEngine, rec: TxRecord, world: World
) -> tuple[JSONObject, FollowUp | None]:
    journal, bound = world.store, log.bind(tx_id=rec.id, kind=rec.kind)
    if rec.state == TxState.PLANNED:
        # The owner died while guards ran: nothing was mutated.
        journal.transition(rec.id, TxState.REFUSED, DIED_BEFORE_MUTATION)
        return {"tx_id": rec.id, "kind": rec.kind, "state": TxState.REFUSED.value, "undone": []}, None
    plan = KINDS[rec.kind].rebuild(rec.args, world)
    ctx = StepContext(tx_id=rec.id, kind=rec.kind, args=plan.args, world=world, memo=plan.memo)
    events = journal.step_events(rec.id)
    steps = {s.name: s for s in plan.steps}
    for ev in events:
        if ev.phase == "do" and ev.event == "result":
            ctx.results[ev.step] = ev.detail
            step = steps.get(ev.step)
            if step is not None and step.remember is not None:
                step.remember(ctx, ev.detail)
    if rec.state in (TxState.RUNNING, TxState.COMPENSATING, TxState.WATCHING):
        journal.transition(rec.id, TxState.INTERRUPTED, f"owner pid {rec.owner.pid} is gone")
    outcome = Outcome(kind=rec.kind, state=TxState.INTERRUPTED, tx_id=rec.id)
    outcome.before = snapshots.of_transaction(journal, rec.id).get("before")
    undone_before = len(_undone(events))
    done = {ev.step for ev in events if ev.phase == "do" and ev.event == "result"}
    # The pivot's result is journaled and no undo has started: the way out is forward.
    forward = plan.pivot in done and not any(ev.phase == "undo" for ev in events)
    try:
        if forward:
            names = [s.name for s in plan.steps]
            start = next((i for i, n in enumerate(names) if n not in done), len(names))
            bound.info("recovering forward", from_step=names[start] if start < len(names) else "commit")
            journal.transition(
                rec.id, TxState.RUNNING, f"recover: past the pivot {plan.pivot}, rolling forward"
            )
            outcome = engine.forward(outcome, plan, ctx, start=start)
        else:
            journal.transition(rec.id, TxState.COMPENSATING, "recover")
            todo = pending_undos(plan, events)
            bound.info("recovering backwards", undos=[s.name for _, s, _ in todo])
            outcome = engine.compensate(outcome, plan, ctx, todo, "recovered after owner died")
    finally:
        engine.commit()  # what the run held: its records and end state
    found: JSONObject = {
        "tx_id": rec.id,
        "kind": rec.kind,
        "state": outcome.state.value,
        "direction": "forward" if forward else "backward",
        # Only undos whose result this recovery journaled.
        "undone": list(_undone(journal.step_events(rec.id))[undone_before:]),
        "reason": outcome.reason,
    }
    return found, outcome.follow_up
