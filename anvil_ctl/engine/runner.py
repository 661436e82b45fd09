"""Runs a Plan as a transaction: guards, then journaled steps, then compensation on failure.

Journal, then act, then record: each step's intent row commits before its `do`
runs and its result row commits right after, so a crash between the two leaves
an intent without a result, which `recover` finds. On a failed step the undos of
the completed steps run in reverse, the failed step's own undo first (a step can
fail after part of its side effect; undos observe before acting), each journaled
the same way. The first undo that fails stops compensation: continuing could
start a serve on GPUs that a failed undo left occupied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from anvil_ctl.core.errors import AnvilError, NeedsOperator, Refused
from anvil_ctl.core.guards import Refusal, first_refusal
from anvil_ctl.core.ports import Journal, Owner
from anvil_ctl.core.snapshot import Change, Snapshot, diff
from anvil_ctl.core.states import STATE_EXIT_CODES, TxState
from anvil_ctl.core.steps import Plan, Step, StepContext
from anvil_ctl.engine.plans.args import to_json

A = TypeVar("A")
W = TypeVar("W")
M = TypeVar("M")

log = structlog.get_logger("anvil.engine")


@dataclass
class Outcome:
    """What a transaction did; `exit_code` is what the CLI returns for it."""

    kind: str
    state: TxState
    tx_id: str | None = None
    reason: str = ""
    dry_run: bool = False
    plan: list[dict[str, str]] = field(default_factory=list)
    refusal: Refusal | None = None
    before: Snapshot | None = None
    after: Snapshot | None = None
    changes: list[Change] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return int(STATE_EXIT_CODES[self.state])

    def as_dict(self) -> dict[str, Any]:
        return {
            "tx_id": self.tx_id,
            "kind": self.kind,
            "state": self.state.value,
            "reason": self.reason,
            "dry_run": self.dry_run,
            "plan": self.plan,
            "refusal": self.refusal.as_dict() if self.refusal else None,
            "before_sha256": self.before.sha256 if self.before else None,
            "after_sha256": self.after.sha256 if self.after else None,
            "changes": [c.as_dict() for c in self.changes],
            "results": self.results,
        }


def _error_detail(exc: BaseException) -> dict[str, Any]:
    detail: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, AnvilError) and exc.data:
        detail["data"] = exc.data
    return detail


class TransactionEngine:
    def __init__(self, journal: Journal, owner: Owner) -> None:
        self.journal = journal
        self.owner = owner

    def run(
        self, plan: Plan[A, W, M], world: W, *, dry_run: bool = False, tx_id: str | None = None
    ) -> Outcome:
        outcome = Outcome(kind=plan.kind, state=TxState.PLANNED, dry_run=dry_run, plan=plan.describe())
        if dry_run:
            ctx = StepContext(tx_id="dry-run", kind=plan.kind, args=plan.args, world=world, memo=plan.memo)
            # Every guard runs and the starting snapshot is observed; nothing is written.
            outcome.refusal = self._check_guards(plan, ctx)
            if outcome.refusal:
                outcome.state, outcome.reason = TxState.REFUSED, outcome.refusal.reason
            outcome.before = plan.snapshot() if plan.snapshot else None
            return outcome

        tx_id = self.journal.begin(
            kind=plan.kind, slot=plan.slot, args=to_json(plan.args), owner=self.owner, tx_id=tx_id
        )
        outcome.tx_id = tx_id
        ctx = StepContext(tx_id=tx_id, kind=plan.kind, args=plan.args, world=world, memo=plan.memo)
        bound = log.bind(tx_id=tx_id, kind=plan.kind)
        refusal = self._check_guards(plan, ctx)
        if refusal is not None:
            self.journal.transition(tx_id, TxState.REFUSED, refusal.reason, refusal.as_dict())
            bound.warning("refused", guard=refusal.guard, reason=refusal.reason)
            outcome.state, outcome.reason, outcome.refusal = (
                TxState.REFUSED,
                refusal.reason,
                refusal,
            )
            return outcome

        if plan.snapshot:
            outcome.before = plan.snapshot()
            self.journal.record_snapshot(tx_id, "before", outcome.before)
        self.journal.transition(tx_id, TxState.RUNNING)
        bound.info("running", steps=len(plan.steps))

        for seq, step in enumerate(plan.steps):
            try:
                self._do(ctx, seq, step)
            except NeedsOperator as exc:
                return self._needs_operator(outcome, ctx, exc, TxState.RUNNING)
            except Exception as exc:
                bound.error("step failed", step=step.name, error=str(exc))
                return self._compensate_after(outcome, plan, ctx, failed=seq, reason=f"{step.name}: {exc}")

        self._observe_after(plan, ctx, outcome, "after")
        problems = (
            plan.verify_after(ctx, outcome.before, outcome.after)
            if (plan.verify_after and outcome.after)
            else []
        )
        if problems:
            self.journal.step_event(
                tx_id,
                seq=len(plan.steps),
                step="verify",
                phase="do",
                event="error",
                detail={"problems": problems},
            )
            return self._compensate_after(
                outcome,
                plan,
                ctx,
                failed=None,
                reason="verification failed: " + "; ".join(problems),
            )
        self.journal.transition(tx_id, TxState.COMMITTED)
        bound.info("committed")
        outcome.state, outcome.results = TxState.COMMITTED, dict(ctx.results)
        return outcome

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
        slog = log.bind(tx_id=ctx.tx_id, step=step.name)
        self.journal.step_event(ctx.tx_id, seq=seq, step=step.name, phase="do", event="intent")
        slog.info("step intent")
        try:
            result = step.do(ctx) or {}
        except Exception as exc:
            self.journal.step_event(
                ctx.tx_id,
                seq=seq,
                step=step.name,
                phase="do",
                event="error",
                detail=_error_detail(exc),
            )
            raise
        ctx.results[step.name] = result
        if step.remember is not None:
            step.remember(ctx, result)
        self.journal.step_event(ctx.tx_id, seq=seq, step=step.name, phase="do", event="result", detail=result)
        slog.info("step done")

    def _compensate_after(
        self,
        outcome: Outcome,
        plan: Plan[A, W, M],
        ctx: StepContext[A, W, M],
        *,
        failed: int | None,
        reason: str,
    ) -> Outcome:
        self.journal.transition(ctx.tx_id, TxState.COMPENSATING, reason)
        last = failed if failed is not None else len(plan.steps) - 1
        todo = [(seq, plan.steps[seq], ctx.results.get(plan.steps[seq].name)) for seq in range(last + 1)]
        return self.compensate(outcome, plan, ctx, todo, reason)

    def compensate(
        self,
        outcome: Outcome,
        plan: Plan[A, W, M],
        ctx: StepContext[A, W, M],
        todo: list[tuple[int, Step[StepContext[A, W, M]], dict[str, Any] | None]],
        reason: str,
    ) -> Outcome:
        """Run the undos of `todo` in reverse; the transaction is already `compensating`."""
        outcome.reason = reason
        for seq, step, result in reversed(todo):
            if step.undo is None:
                continue
            slog = log.bind(tx_id=ctx.tx_id, step=step.name)
            self.journal.step_event(ctx.tx_id, seq=seq, step=step.name, phase="undo", event="intent")
            try:
                undone = step.undo(ctx, result) or {}
            except NeedsOperator as exc:
                self.journal.step_event(
                    ctx.tx_id,
                    seq=seq,
                    step=step.name,
                    phase="undo",
                    event="error",
                    detail=_error_detail(exc),
                )
                # Keep the cause: the operator needs both what failed and what was left.
                cause = NeedsOperator(f"{exc} (cause: {reason})", **exc.data)
                return self._needs_operator(outcome, ctx, cause, TxState.COMPENSATING)
            except Exception as exc:
                slog.error("undo failed", error=str(exc))
                self.journal.step_event(
                    ctx.tx_id,
                    seq=seq,
                    step=step.name,
                    phase="undo",
                    event="error",
                    detail=_error_detail(exc),
                )
                why = f"undo of {step.name} failed: {exc} (after: {reason})"
                self.journal.transition(ctx.tx_id, TxState.COMPENSATION_FAILED, why)
                outcome.state, outcome.reason = TxState.COMPENSATION_FAILED, why
                return outcome
            self.journal.step_event(
                ctx.tx_id, seq=seq, step=step.name, phase="undo", event="result", detail=undone
            )
            slog.info("undo done")
        self._observe_after(plan, ctx, outcome, "compensated")
        self.journal.transition(ctx.tx_id, TxState.COMPENSATED, reason)
        outcome.state, outcome.results = TxState.COMPENSATED, dict(ctx.results)
        return outcome

    def _observe_after(
        self, plan: Plan[A, W, M], ctx: StepContext[A, W, M], outcome: Outcome, label: str
    ) -> None:
        """Snapshot the world as it is now and record its diff against the before snapshot."""
        if not plan.snapshot:
            return
        outcome.after = plan.snapshot()
        self.journal.record_snapshot(ctx.tx_id, label, outcome.after)
        if outcome.before is not None:
            outcome.changes = diff(outcome.before, outcome.after)
            self.journal.record_diff(
                ctx.tx_id, f"before-{label}", outcome.before, outcome.after, outcome.changes
            )

    def _needs_operator(
        self, outcome: Outcome, ctx: StepContext[A, W, M], exc: NeedsOperator, source: TxState
    ) -> Outcome:
        self.journal.transition(ctx.tx_id, TxState.NEEDS_OPERATOR, str(exc), exc.data)
        outcome.state, outcome.reason = TxState.NEEDS_OPERATOR, str(exc)
        outcome.results = dict(ctx.results)
        return outcome
