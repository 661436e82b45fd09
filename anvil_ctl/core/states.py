"""Transaction states and the one table of allowed transitions.

Theory of operation: a transaction is `planned` when its row is written. Guards
run; any refusal moves it to `refused` and nothing on the host was touched.
Otherwise it becomes `running` and its steps execute in order. If every step
succeeds it is `committed`. If a step fails it becomes `compensating` and the
undos of the completed steps run in reverse; if all succeed it is
`compensated`, otherwise `compensation_failed`, which only a person resolves.
A transaction whose owner process died while `running` or `compensating` is
found by `recover`, marked `interrupted`, and compensated from there.

The table below is the only place that says which moves are legal; the engine
calls `check_transition` before it writes any state row.
"""

from __future__ import annotations

from enum import StrEnum

from anvil_ctl.core.errors import IllegalTransition


class TxState(StrEnum):
    PLANNED = "planned"
    RUNNING = "running"
    COMMITTED = "committed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    REFUSED = "refused"
    INTERRUPTED = "interrupted"
    NEEDS_OPERATOR = "needs_operator"


S = TxState

ALLOWED_TRANSITIONS: frozenset[tuple[TxState, TxState]] = frozenset(
    {
        (S.PLANNED, S.RUNNING),
        (S.PLANNED, S.REFUSED),
        (S.RUNNING, S.COMMITTED),
        (S.RUNNING, S.COMPENSATING),
        (S.RUNNING, S.INTERRUPTED),
        # A step may decide the host must not be touched further (e.g. a retained
        # incumbent that could not be proven stopped): only a person goes on from here.
        (S.RUNNING, S.NEEDS_OPERATOR),
        (S.COMPENSATING, S.COMPENSATED),
        (S.COMPENSATING, S.COMPENSATION_FAILED),
        (S.COMPENSATING, S.INTERRUPTED),
        (S.COMPENSATING, S.NEEDS_OPERATOR),
        (S.INTERRUPTED, S.COMPENSATING),
        # A person resolves these by hand and records that they did.
        (S.COMPENSATION_FAILED, S.COMPENSATED),
        (S.NEEDS_OPERATOR, S.COMPENSATED),
    }
)

TERMINAL_STATES = frozenset({S.COMMITTED, S.COMPENSATED, S.REFUSED})
"""States from which no automatic move exists."""

OWNER_ALIVE_STATES = frozenset({S.PLANNED, S.RUNNING, S.COMPENSATING})
"""States that mean a live process is working on the transaction."""

OPERATOR_STATES = frozenset({S.COMPENSATION_FAILED, S.NEEDS_OPERATOR, S.INTERRUPTED})
"""States that need `recover` or a person."""


def check_transition(source: TxState, target: TxState) -> None:
    """Raise IllegalTransition unless (source, target) is in the table; change nothing."""
    if (source, target) not in ALLOWED_TRANSITIONS:
        raise IllegalTransition(source.value, target.value)
