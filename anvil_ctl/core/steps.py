"""Steps and plans: every forward step declares its compensation beside it.

A `Step` is `(name, do, undo)`. `do(ctx)` returns a JSON-able result (recorded
in the journal right after the side effect); `undo(ctx, result)` receives that
recorded result, or None when the process died between the step's intent and its
result. Undos therefore observe the world before acting and must be idempotent:
`recover` may run them after a crash, and may run them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anvil_ctl.core.snapshot import Snapshot

StepResult = dict[str, Any] | None


@dataclass
class StepContext:
    """What a step sees: the transaction, its arguments, earlier results and the ports."""

    tx_id: str
    kind: str
    args: Mapping[str, Any]
    world: Any
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def result(self, step: str) -> dict[str, Any]:
        return self.results.get(step) or {}


@dataclass(frozen=True)
class Step:
    name: str
    do: Callable[[StepContext], StepResult]
    undo: Callable[[StepContext, StepResult], StepResult] | None = None
    description: str = ""


@dataclass(frozen=True)
class Plan:
    """A transaction kind's ordered guards and steps, built from journaled arguments.

    `snapshot` observes the live placement (read-only); `verify_after` may compare
    the before and after snapshots and return problems that fail the commit.
    """

    kind: str
    args: Mapping[str, Any]
    steps: Sequence[Step]
    guards: Sequence[Any] = ()
    slot: str | None = None
    snapshot: Callable[[], Snapshot] | None = None
    verify_after: Callable[[StepContext, Snapshot | None, Snapshot], list[str]] | None = None
    mutates: bool = True

    def describe(self) -> list[dict[str, str]]:
        return [
            {"step": s.name, "undo": "yes" if s.undo else "no", "description": s.description}
            for s in self.steps
        ]
