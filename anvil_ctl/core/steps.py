"""Guards, steps and plans: every forward step declares its compensation beside it.

A guard (its docstring is its invariant) reads through ports and returns None or a `Refusal`;
a plan lists its guards cheap first, and the first refusal stops it before any mutation.
`do(ctx)` returns a JSON-able result, journaled right after the side effect; `undo(ctx, result)`
gets it, or None when the process died in between, so undos observe before acting and are
idempotent (`recover` may run them twice). A step hands what a later one needs through the
plan's typed *memo* (`remember`, replayed by `recover` from the journal). Before the plan's
*pivot* a failure compensates backwards; after it `recover` re-runs the remaining steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.snapshot import Snapshot

C_contra = TypeVar("C_contra", contravariant=True)
"""The step context the guard reads (a guard for every kind takes the widest one)."""


@dataclass(frozen=True)
class Refusal:
    guard: str
    reason: str
    data: dict[str, object]

    def as_dict(self) -> dict[str, object]:
        return {"guard": self.guard, "reason": self.reason, "data": self.data}


class Guard(Generic[C_contra]):
    """Base class: override `check`."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def check(self, ctx: C_contra) -> Refusal | None:
        raise NotImplementedError

    def refuse(self, reason: str, /, **data: object) -> Refusal:
        return Refusal(self.name, reason, data)


def first_refusal(guards: Sequence[Guard[C_contra]], ctx: C_contra) -> Refusal | None:
    for guard in guards:
        refusal = guard.check(ctx)
        if refusal is not None:
            return refusal
    return None


StepResult = JSONObject | None
"""What a do or undo reports: JSON-able detail, journaled as the step's result."""

A_co = TypeVar("A_co", covariant=True)
"""The transaction kind's frozen argument dataclass."""
W_co = TypeVar("W_co", covariant=True)
"""The world of ports the steps act through."""
M_co = TypeVar("M_co", covariant=True)
"""The plan's memo: named fields one step leaves for the next."""


@dataclass
class NoMemo:
    """The memo of a plan whose steps hand nothing to each other."""


@dataclass(frozen=True)
class StepContext(Generic[A_co, W_co, M_co]):
    """What a step sees: the transaction, its typed arguments, the world and the memo.

    `results` is the journaled record `recover` reloads; steps read what an earlier step left
    them from `memo`, never from `results`.
    """

    tx_id: str
    kind: str
    args: A_co
    world: W_co
    memo: M_co
    results: dict[str, JSONObject] = field(default_factory=dict)


Hold = Callable[[Callable[[], object]], None]
"""Keep a record (a journal write) to commit with the engine's next journal write."""

C = TypeVar("C")
"""A step's context type: StepContext[its plan's args, world, memo]."""


@dataclass(frozen=True)
class Step(Generic[C]):
    name: str
    do: Callable[[C], StepResult]
    undo: Callable[[C, StepResult], StepResult] | None = None
    description: str = ""
    remember: Callable[[C, JSONObject], None] | None = None
    """Copy this step's journaled result into the context's memo (live and in `recover`)."""


Record = Callable[[str, JSONObject], None]
"""Journal one event of a plan's watch now: (event name, detail)."""


@dataclass(frozen=True)
class WatchEnd:
    """How a plan's watch ended. Healthy: the transaction commits with `data` as evidence.
    Otherwise it ends `rolled_back` with `reason` and `data`, and `then` (a request of another
    kind) runs as a transaction of its own under the same host lock; the end state names it
    (`followed_by`: its kind and transaction ID)."""

    healthy: bool
    reason: str
    data: JSONObject
    then: object | None = None


@dataclass(frozen=True)
class Plan(Generic[A_co, W_co, M_co]):
    """A transaction kind's ordered guards and steps, built from journaled arguments.

    `verify_after` compares the before and after snapshots and returns problems that fail
    the commit; what it records goes to `hold`, committed with the end state.
    """

    kind: str
    args: A_co
    steps: Sequence[Step[StepContext[A_co, W_co, M_co]]]
    memo: M_co
    guards: Sequence[Guard[StepContext[A_co, W_co, M_co]]] = ()
    slot: str | None = None
    snapshot: Callable[[], Snapshot] | None = None
    verify_after: (
        Callable[[StepContext[A_co, W_co, M_co], Snapshot | None, Snapshot, Hold], list[str]] | None
    ) = None
    pivot: str | None = None
    """Name of the step after which recovery goes forward (None: always backwards)."""
    keeps_serving: bool = True
    """Never dark: a slot serving at the start serves at the end; False only for unload or no-ops."""
    goal: Callable[[StepContext[A_co, W_co, M_co]], list[str]] | None = None
    """Problems that keep the goal from holding after the last step (e.g. the route is gone)."""
    repair: Callable[[StepContext[A_co, W_co, M_co]], None] | None = None
    """Re-applies the goal once when `goal` reports problems (e.g. route again), before failing."""
    watch: Callable[[StepContext[A_co, W_co, M_co], Record], WatchEnd] | None = None
    """Past the goal and verification, the transaction is `watching` until this returns (a
    watched promote); None: it commits at once."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"plan {self.kind}: step names repeat: {names}")
        if self.pivot is not None and self.pivot not in names:
            raise ValueError(f"plan {self.kind}: pivot {self.pivot!r} is not one of its steps {names}")

    def describe(self) -> list[dict[str, str]]:
        return [
            {
                "step": s.name,
                "undo": "yes" if s.undo else "no",
                "description": s.description,
                "pivot": "yes" if s.name == self.pivot else "no",
            }
            for s in self.steps
        ]
