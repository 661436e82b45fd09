"""Transaction states and the one table of allowed transitions.

Theory of operation: `planned` when written; a guard's refusal ends it `refused` with nothing
touched; else `running`, then `committed`. A failed step makes it `compensating` (the undos of
completed steps in reverse) and then `compensated`, or `compensation_failed` for a person.
An owner that died leaves it for `recover`: `interrupted`, then compensated, or run forward
past the plan's pivot. A watched promote is `watching` after its last step: healthy, it is
`committed`; a breach or a person's abort ends it `rolled_back`, and a rollback of its own
follows. The engine calls `check_transition` before writing any state row."""

from __future__ import annotations

from enum import IntEnum, StrEnum


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
    WATCHING = "watching"
    ROLLED_BACK = "rolled_back"


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
        # A watched promote: past its last step it samples its serve before it commits.
        (S.RUNNING, S.WATCHING),
        (S.WATCHING, S.COMMITTED),
        # A breach or a person ended the watch; a rollback transaction of its own follows.
        (S.WATCHING, S.ROLLED_BACK),
        (S.WATCHING, S.INTERRUPTED),
        # The watch could not judge (the router refused our client key): the serve stays.
        (S.WATCHING, S.NEEDS_OPERATOR),
        (S.COMPENSATING, S.COMPENSATED),
        (S.COMPENSATING, S.COMPENSATION_FAILED),
        (S.COMPENSATING, S.INTERRUPTED),
        (S.COMPENSATING, S.NEEDS_OPERATOR),
        (S.INTERRUPTED, S.COMPENSATING),
        # Past the plan's pivot, recover rolls forward instead.
        (S.INTERRUPTED, S.RUNNING),
        # A person resolves these by hand and records that they did.
        (S.COMPENSATION_FAILED, S.COMPENSATED),
        (S.NEEDS_OPERATOR, S.COMPENSATED),
    }
)

UNFINISHED_STATES = frozenset({S.PLANNED, S.RUNNING, S.COMPENSATING, S.INTERRUPTED, S.WATCHING})
"""States `recover` resolves: the transaction did not reach an end (or its owner died)."""

WAITING_STATES = frozenset({S.COMPENSATION_FAILED, S.NEEDS_OPERATOR})
"""States only a person resolves (`anvilctl resolve`)."""

UNRESOLVED_STATES = UNFINISHED_STATES | WAITING_STATES
"""No mutation may start while any transaction is in one of these."""


class ExitCode(IntEnum):
    """What `anvilctl` returns; the README's table is this one."""

    OK = 0
    INTERNAL = 1  # a bug: rerun with --debug and report it
    BAD_INPUT = 2  # a file, field or argument is wrong; nothing changed
    REFUSED = 3  # rejected before the first mutation; only the refusal is recorded
    COMPENSATED = 4  # a step failed and the undos restored the before state
    NEEDS_OPERATOR = 5  # compensation failed, or an interrupted transaction is unresolved
    DRIFT = 6  # the host or the journal differs from the record
    UNAVAILABLE = 7  # a dependency (database, Docker, NVML, router) is busy, locked, full or unreachable
    HOST_CLAIMED = 8  # another machine holds this host name in the state database; nothing changed
    TARGET_HOLDS_HOST = 9  # `db copy`: the target already holds this host's history; nothing written
    ROLLED_BACK = 10  # a watched promote was rolled back (a breach, or a person); the incumbent serves


STATE_EXIT_CODES: dict[TxState, ExitCode] = {
    S.COMMITTED: ExitCode.OK,
    S.PLANNED: ExitCode.OK,  # a dry run ends planned: nothing was written
    S.REFUSED: ExitCode.REFUSED,
    S.COMPENSATED: ExitCode.COMPENSATED,
    S.RUNNING: ExitCode.NEEDS_OPERATOR,
    S.COMPENSATING: ExitCode.NEEDS_OPERATOR,
    S.COMPENSATION_FAILED: ExitCode.NEEDS_OPERATOR,
    S.INTERRUPTED: ExitCode.NEEDS_OPERATOR,
    S.NEEDS_OPERATOR: ExitCode.NEEDS_OPERATOR,
    S.WATCHING: ExitCode.NEEDS_OPERATOR,
    S.ROLLED_BACK: ExitCode.ROLLED_BACK,
}
"""The exit code of a command whose transaction ended in a state (every state is listed)."""


class IllegalTransition(RuntimeError):
    """A transaction state change that the transition table does not allow (a programming error)."""

    def __init__(self, source: str, target: str) -> None:
        super().__init__(f"illegal transaction transition {source} -> {target}")
        self.source = source
        self.target = target


def check_transition(source: TxState, target: TxState) -> None:
    """Raise IllegalTransition unless (source, target) is in the table; change nothing."""
    if (source, target) not in ALLOWED_TRANSITIONS:
        raise IllegalTransition(source.value, target.value)


TX_KINDS: tuple[str, ...] = (
    "adopt",
    "load",
    "qualify",
    "ab",
    "promote",
    "canary",
    "rollback",
    "unload",
    "reconcile",
)
"""Every kind of transaction a plan is built for (`audit transactions --kind` offers these)."""

IDENTITY_ROLES: tuple[str, ...] = ("incumbent", "candidate", "rollback")
"""The roles an identity is recorded under for its slot (here so `--help` loads no value objects)."""
