"""Runs a Plan as a transaction: guards, then journaled steps, then compensation on failure.

Each step's intent commits before its `do` runs; its result commits with the next write, so a
crash between leaves an intent without a result for `recover`. The undos run in reverse, the
failed step's own first; the first undo that fails stops compensation (going on could start a
serve on GPUs it left occupied). A slot that served at the start serves again before any end
state but `committed` (`engine.availability`). The end state is held for `engine.entry`.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from anvil_ctl.core.errors import AnvilError, AuthRejected, DrainRefused, NeedsOperator, Refused
from anvil_ctl.core.jsontypes import JSONMapping, JSONObject
from anvil_ctl.core.snapshot import diff
from anvil_ctl.core.states import UNFINISHED_STATES, TxState
from anvil_ctl.core.steps import Plan, Refusal, Step, StepContext, first_refusal
from anvil_ctl.engine.availability import ensure_serving, observe_slot, record_harbour
from anvil_ctl.engine.outcome import FollowUp, Outcome
from anvil_ctl.engine.world import World, one_reading
from anvil_ctl.log import get_logger
from anvil_ctl.persistence.store import Store

A = TypeVar("A")
M = TypeVar("M")
W = World
AVAILABILITY = "availability"

log = get_logger("anvil.engine")


@dataclass(frozen=True)
class Faults:
    """Fault injection at journal boundaries (`KIND:STEP:PHASE:EVENT`, `KIND:state:STATE`, `*`
    allowed), for the fault-injection tests and `make chaos` only; off unless settings name them."""

    crash_at: str | None = None
    pause_at: str | None = None
    pause_file: Path | None = None

    def at(self, boundary: str) -> None:
        """Called by the engine right after the row of `boundary` commits."""
        if self.crash_at and fnmatch.fnmatchcase(boundary, self.crash_at):
            log.warning("crash_at boundary reached: SIGKILL", boundary=boundary)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause_at and self.pause_file and fnmatch.fnmatchcase(boundary, self.pause_at):
            log.warning("pause_at boundary reached: waiting", boundary=boundary, file=str(self.pause_file))
            self.pause_file.write_text(boundary + "\n")
            deadline = time.monotonic() + 600.0  # a forgotten pause file never hangs a run
            while self.pause_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)


NO_FAULTS = Faults()


def _error_detail(exc: BaseException) -> dict[str, object]:
    detail: dict[str, object] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, AnvilError) and exc.data:
        detail["data"] = exc.data
    return detail


class TransactionEngine:
    def __init__(
        self,
        journal: Store,
        *,
        faults: Faults = NO_FAULTS,
        mint: Callable[[], str] | None = None,
        keep_reading: bool = False,
    ) -> None:
        self.journal = journal
        self.faults = faults
        self.mint = mint  # the entry's: makes a follow-up's transaction ID
        self.keep_reading = keep_reading  # the after reading, for the transaction run next (`one_reading`)
        self._held: list[tuple[Callable[[], object], str]] = []

    def _hold(self, write: Callable[[], object], boundary: str = "") -> None:
        self._held.append((write, boundary))

    def commit(self, write: Callable[[], object] | None = None, boundary: str | None = None) -> None:
        """Write what is held (the end state) and then `write`, as one; then pass their boundaries."""
        held, self._held = self._held, []
        todo = [*held, *([(write, boundary or "")] if write is not None else [])]
        if len(todo) == 1:
            todo[0][0]()
        elif todo:
            with self.journal.together():
                for w, _b in todo:
                    w()
        for _w, b in todo:
            if b:
                self.faults.at(b)

    def _write(self, write: Callable[[], object], boundary: str, hold: bool) -> None:
        if hold:
            self._hold(write, boundary)
        else:
            self.commit(write, boundary)

    def _event(
        self,
        ctx: StepContext[A, W, M],
        seq: int,
        step: str,
        phase: str,
        event: str,
        *,
        detail: JSONMapping | None = None,
        hold: bool = False,
    ) -> None:
        write = partial(self.journal.step_event, ctx.tx_id, seq=seq, step=step, phase=phase, event=event)
        self._write(partial(write, detail=detail), ":".join((ctx.kind, step, phase, event)), hold)

    def _transition(
        self,
        ctx: StepContext[A, W, M],
        target: TxState,
        reason: str = "",
        data: JSONMapping | None = None,
        *,
        hold: bool = False,
    ) -> None:
        write = partial(self.journal.transition, ctx.tx_id, target, reason, data)
        boundary = ":".join((ctx.kind, "state", target.value))
        self._write(write, boundary, hold or target not in UNFINISHED_STATES)  # an end state waits

    def dry_run(self, plan: Plan[A, W, M], world: W) -> Outcome:
        """Every guard runs and the starting snapshot is observed; nothing is written."""
        outcome = Outcome(kind=plan.kind, state=TxState.PLANNED, dry_run=True, plan=plan.describe())
        ctx = StepContext(tx_id="dry-run", kind=plan.kind, args=plan.args, world=world, memo=plan.memo)
        with one_reading(world):
            outcome.refusal = self._check_guards(plan, ctx)
            if outcome.refusal:
                outcome.state, outcome.reason = TxState.REFUSED, outcome.refusal.reason
            outcome.before = plan.snapshot() if plan.snapshot else None
        return outcome

    def run(self, plan: Plan[A, W, M], world: W, tx_id: str) -> Outcome:
        """Run the begun transaction `tx_id` as `plan`; its end state is held for `commit`."""
        outcome = Outcome(kind=plan.kind, state=TxState.PLANNED, plan=plan.describe(), tx_id=tx_id)
        ctx = StepContext(tx_id=tx_id, kind=plan.kind, args=plan.args, world=world, memo=plan.memo)
        self.faults.at(":".join((plan.kind, "state", "planned")))
        started = time.monotonic()
        world.progress.transaction(tx_id, plan.kind, plan.slot, len(plan.steps))
        try:
            return self._run(outcome, plan, ctx)
        except BaseException:
            self.commit()
            raise
        finally:
            world.progress.finished(outcome.state.value, outcome.reason, time.monotonic() - started)

    def _run(self, outcome: Outcome, plan: Plan[A, W, M], ctx: StepContext[A, W, M]) -> Outcome:
        tx_id, progress = ctx.tx_id, ctx.world.progress
        bound = log.bind(tx_id=tx_id, kind=plan.kind)
        t0 = time.monotonic()
        progress.step_started(-1, "guards", "check", f"{len(plan.guards)} checks before any change")
        # A transaction following another at once starts from that one's closing reading.
        with one_reading(ctx.world, resume=True):
            refusal = self._check_guards(plan, ctx)
            progress.step_finished(
                -1,
                "guards",
                "check",
                ok=refusal is None,
                elapsed_s=time.monotonic() - t0,
                error=refusal.reason if refusal else "",
            )
            if refusal is not None:
                self._transition(ctx, TxState.REFUSED, refusal.reason, refusal.as_dict())
                bound.warning("refused", guard=refusal.guard, reason=refusal.reason)
                outcome.state, outcome.reason, outcome.refusal = TxState.REFUSED, refusal.reason, refusal
                return outcome

            if plan.snapshot:
                started = time.perf_counter()
                progress.activity("observing the host: the before snapshot")
                before = outcome.before = plan.snapshot()
                seconds = round(time.perf_counter() - started, 3)
                bound.debug("snapshot observed", label="before", seconds=seconds)
                self._hold(lambda: self.journal.record_snapshot(tx_id, "before", before))
            # Held: the before snapshot, `running` and the availability check only observe, so
            # they commit with the first intent, before the first side effect.
            self._transition(ctx, TxState.RUNNING, hold=True)
            if plan.keeps_serving and plan.slot:
                # Whether the slot serves now and, if so, which serve is its safe harbour (journaled).
                state = observe_slot(ctx.world, plan.slot)
                harbour = record_harbour(ctx.world, ctx.tx_id, state, self._hold)
                detail = {**state.as_dict(), "harbour": harbour.container_id if harbour else None}
                self._event(ctx, -1, AVAILABILITY, "check", "before", detail=detail, hold=True)
        bound.info("running", steps=len(plan.steps))
        return self.forward(outcome, plan, ctx, start=0)

    def forward(
        self, outcome: Outcome, plan: Plan[A, W, M], ctx: StepContext[A, W, M], *, start: int
    ) -> Outcome:
        """Run the steps from `start`, then the goal and verification; the end state is held."""
        bound = log.bind(tx_id=ctx.tx_id, kind=plan.kind)
        for seq in range(start, len(plan.steps)):
            step = plan.steps[seq]
            try:
                self._do(ctx, seq, step)
            except NeedsOperator as exc:
                return self._needs_operator(outcome, plan, ctx, exc)
            except AuthRejected as exc:
                return self._not_judged(outcome, plan, ctx, step.name, exc)
            except Exception as exc:
                bound.error("step failed", step=step.name, error=str(exc))
                outcome.drain_refused = isinstance(exc, DrainRefused)
                return self._compensate_after(outcome, plan, ctx, failed=seq, reason=f"{step.name}: {exc}")

        try:
            goal = self._goal_problems(plan, ctx)
        except AuthRejected as exc:
            self._event(ctx, len(plan.steps), "goal", "do", "error", detail=_error_detail(exc))
            return self._not_judged(outcome, plan, ctx, "the goal check", exc)
        if goal:
            self._event(ctx, len(plan.steps), "goal", "do", "error", detail={"problems": goal})
            return self._compensate_after(
                outcome, plan, ctx, failed=None, reason="goal does not hold: " + "; ".join(goal)
            )
        self._observe_after(plan, ctx, outcome, "after")
        problems = (
            plan.verify_after(ctx, outcome.before, outcome.after, self._hold)
            if (plan.verify_after and outcome.after)
            else []
        )
        if problems:
            self._event(ctx, len(plan.steps), "verify", "do", "error", detail={"problems": problems})
            reason = "verification failed: " + "; ".join(problems)
            state = observe_slot(ctx.world, plan.slot) if plan.slot else None
            if state is not None and (state.serving or state.refused):
                # Availability outranks symmetry: the slot serves (or its route could not be
                # observed, which says nothing about the serve); a person decides about the rest.
                return self._needs_operator(outcome, plan, ctx, NeedsOperator(reason + " (the slot serves)"))
            return self._compensate_after(outcome, plan, ctx, failed=None, reason=reason)
        if plan.watch is not None:
            return self._watch(outcome, plan, ctx)
        self._transition(ctx, TxState.COMMITTED)
        bound.info("committed")
        outcome.state, outcome.results = TxState.COMMITTED, dict(ctx.results)
        return outcome

    def _watch(self, outcome: Outcome, plan: Plan[A, W, M], ctx: StepContext[A, W, M]) -> Outcome:
        """`watching` until the watch ends: committed when healthy, else `rolled_back` with a follow-up."""
        assert plan.watch is not None
        seq = len(plan.steps)
        self._transition(ctx, TxState.WATCHING, "watching the serve on the route")
        ctx.world.progress.activity(f"watching slot {plan.slot} through the route")

        def record(event: str, detail: JSONObject) -> None:
            self._event(ctx, seq, "watch", "watch", event, detail=detail)

        try:
            end = plan.watch(ctx, record)
        except AnvilError as exc:
            # The watch could not judge (the router refused our client key, say): an auth
            # failure is not a model failure, so the serve stays routed and a person decides.
            self._event(ctx, seq, "watch", "watch", "error", detail=_error_detail(exc))
            why = NeedsOperator(f"the watch could not judge the serve: {type(exc).__name__}: {exc}")
            return self._needs_operator(outcome, plan, ctx, why)
        outcome.results = {**ctx.results, "watch": end.data}
        if end.healthy:
            self._transition(ctx, TxState.COMMITTED, end.reason, end.data)
            outcome.state = TxState.COMMITTED
            return outcome
        reason, data = end.reason, end.data
        kind = getattr(end.then, "kind", None)
        if end.then is not None and self.mint is not None and isinstance(kind, str):
            outcome.follow_up = FollowUp(end.then, self.mint())
            reason += f" (then {kind} {outcome.follow_up.tx_id})"
            data = {**data, "followed_by": {"kind": kind, "tx_id": outcome.follow_up.tx_id}}
        self._transition(ctx, TxState.ROLLED_BACK, reason, data)
        log.warning("watch ended the transaction", tx_id=ctx.tx_id, reason=reason)
        outcome.state, outcome.reason = TxState.ROLLED_BACK, reason
        return outcome

    def _goal_problems(self, plan: Plan[A, W, M], ctx: StepContext[A, W, M]) -> list[str]:
        if plan.goal is None:
            return []
        try:
            problems = plan.goal(ctx)
            if problems and plan.repair is not None:
                log.warning("goal does not hold; re-applying once", tx_id=ctx.tx_id, problems=problems)
                plan.repair(ctx)
                problems = plan.goal(ctx)
        except AuthRejected:
            raise  # our credentials, not the goal
        except AnvilError as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        return problems

    def _not_judged(
        self, outcome: Outcome, plan: Plan[A, W, M], ctx: StepContext[A, W, M], where: str, exc: AuthRejected
    ) -> Outcome:
        """The router refused our credentials, which says nothing about the serve: nothing is
        undone (the undos would be refused too) and the transaction waits for a person."""
        log.error("router refused our credentials", tx_id=ctx.tx_id, at=where, error=str(exc))
        why = NeedsOperator(
            f"{where}: the router refused our credentials ({exc}); nothing was undone: fix the "
            "credential, check the slot (`anvilctl recheck`), then `anvilctl resolve`",
            **exc.data,
        )
        return self._needs_operator(outcome, plan, ctx, why)

    def _check_guards(self, plan: Plan[A, W, M], ctx: StepContext[A, W, M]) -> Refusal | None:
        try:
            return first_refusal(plan.guards, ctx)
        except Refused as exc:
            return Refusal(type(exc).__name__, str(exc), exc.data)
        except AnvilError as exc:
            # A guard that cannot observe what it must check refuses: never mutate blind.
            return Refusal(type(exc).__name__, f"could not check: {exc}", exc.data)
        except Exception as exc:
            return Refusal(type(exc).__name__, f"guard failed: {type(exc).__name__}: {exc}", {})

    def _do(self, ctx: StepContext[A, W, M], seq: int, step: Step[StepContext[A, W, M]]) -> None:
        result = self._step(ctx, seq, step, "do", lambda: step.do(ctx))
        ctx.results[step.name] = result
        if step.remember is not None:
            step.remember(ctx, result)

    def _step(
        self,
        ctx: StepContext[A, W, M],
        seq: int,
        step: Step[StepContext[A, W, M]],
        phase: str,
        call: Callable[[], JSONObject | None],
    ) -> JSONObject:
        """Journal `phase`'s intent, run `call`, hold its result; an error is journaled and raised."""
        slog = log.bind(tx_id=ctx.tx_id, step=step.name)
        progress, t0 = ctx.world.progress, time.monotonic()
        self._event(ctx, seq, step.name, phase, "intent")
        if phase == "do":
            slog.info("step intent")
        about = step.description if phase == "do" else f"undo: {step.description}"
        progress.step_started(seq, step.name, phase, about)
        try:
            result = call() or {}
        except Exception as exc:
            progress.step_finished(
                seq, step.name, phase, ok=False, elapsed_s=time.monotonic() - t0, error=str(exc)
            )
            self._event(ctx, seq, step.name, phase, "error", detail=_error_detail(exc))
            raise
        self._event(ctx, seq, step.name, phase, "result", detail=result, hold=True)
        progress.step_finished(seq, step.name, phase, ok=True, elapsed_s=time.monotonic() - t0, error="")
        slog.info("step done" if phase == "do" else "undo done")
        return result

    def _compensate_after(
        self,
        outcome: Outcome,
        plan: Plan[A, W, M],
        ctx: StepContext[A, W, M],
        *,
        failed: int | None,
        reason: str,
    ) -> Outcome:
        self._transition(ctx, TxState.COMPENSATING, reason)
        last = failed if failed is not None else len(plan.steps) - 1
        todo = [(seq, plan.steps[seq], ctx.results.get(plan.steps[seq].name)) for seq in range(last + 1)]
        return self.compensate(outcome, plan, ctx, todo, reason)

    def compensate(
        self,
        outcome: Outcome,
        plan: Plan[A, W, M],
        ctx: StepContext[A, W, M],
        todo: list[tuple[int, Step[StepContext[A, W, M]], JSONObject | None]],
        reason: str,
    ) -> Outcome:
        """Run the undos of `todo` in reverse (the transaction is `compensating`)."""
        outcome.reason = reason
        ctx.world.undoing = True  # undos wait as long as configured, whatever --timeout said
        for seq, step, result in reversed(todo):
            undo = step.undo
            if undo is None:
                continue
            try:
                self._step(ctx, seq, step, "undo", partial(undo, ctx, result))
            except Exception as exc:
                if isinstance(exc, NeedsOperator):
                    # Keep the cause: the operator needs both what failed and what was left.
                    cause = NeedsOperator(f"{exc} (cause: {reason})", **exc.data)
                    return self._needs_operator(outcome, plan, ctx, cause)
                log.error("undo failed", tx_id=ctx.tx_id, step=step.name, error=str(exc))
                why = f"undo of {step.name} failed: {exc} (after: {reason})"
                why += self._keep_serving(plan, ctx)
                self._transition(ctx, TxState.COMPENSATION_FAILED, why)
                outcome.state, outcome.reason = TxState.COMPENSATION_FAILED, why
                return outcome
        reason += self._keep_serving(plan, ctx)
        self._observe_after(plan, ctx, outcome, "compensated")
        self._transition(ctx, TxState.COMPENSATED, reason)
        outcome.state, outcome.reason, outcome.results = TxState.COMPENSATED, reason, dict(ctx.results)
        return outcome

    def _keep_serving(self, plan: Plan[A, W, M], ctx: StepContext[A, W, M]) -> str:
        """Serve again if the slot served at the start; a note for the reason (empty: nothing done)."""
        if not (plan.keeps_serving and plan.slot):
            return ""
        events = self.journal.step_events(ctx.tx_id)
        before = next((ev.detail for ev in events if ev.step == AVAILABILITY and ev.event == "before"), {})
        if not before.get("serving"):
            return ""
        ctx.world.undoing = True
        ctx.world.progress.activity(f"making sure slot {plan.slot} serves (it did at the start)")
        result = ensure_serving(ctx.world, ctx.tx_id, plan.slot)
        if result.get("unobserved"):
            return f"; the route could not be observed, so nothing was touched: {result['unobserved']}"
        if result["action"] == "none" and "problem" not in result:
            return ""
        self._event(ctx, len(plan.steps), AVAILABILITY, "check", "restored", detail=result)
        if result.get("error") or result.get("problem"):
            return f"; the slot could NOT be made to serve again: {result.get('error') or result['problem']}"
        return f"; the slot serves again ({result['action']}: {str(result.get('container_id', ''))[:12]})"

    def _observe_after(
        self, plan: Plan[A, W, M], ctx: StepContext[A, W, M], outcome: Outcome, label: str
    ) -> None:
        """Snapshot the world as it is now and record its diff against the before snapshot."""
        if not plan.snapshot:
            return
        ctx.world.progress.activity(f"observing the host: the {label} snapshot")
        with one_reading(ctx.world, keep=self.keep_reading and label == "after"):
            after = outcome.after = plan.snapshot()
        self._hold(lambda: self.journal.record_snapshot(ctx.tx_id, label, after))
        before = outcome.before
        if before is not None:
            changes = outcome.changes = diff(before, after)
            self._hold(lambda: self.journal.record_diff(ctx.tx_id, f"before-{label}", before, after, changes))

    def _needs_operator(
        self, outcome: Outcome, plan: Plan[A, W, M], ctx: StepContext[A, W, M], exc: NeedsOperator
    ) -> Outcome:
        reason = str(exc) + self._keep_serving(plan, ctx)
        self._transition(ctx, TxState.NEEDS_OPERATOR, reason, exc.data)
        outcome.state, outcome.reason, outcome.results = TxState.NEEDS_OPERATOR, reason, dict(ctx.results)
        return outcome
