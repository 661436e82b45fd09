"""Guards: small named checks that refuse a transaction before its first mutation.

Each guard's docstring states the invariant it protects. A guard reads the world
through ports and returns None, or a `Refusal` naming what is wrong; it never
changes anything. The engine runs every guard selected for a transaction kind, in
list order, and stops at the first refusal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Refusal:
    guard: str
    reason: str
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"guard": self.guard, "reason": self.reason, "data": self.data}


class Guard:
    """Base class: override `check`; set `kinds` to the transaction kinds it applies to."""

    kinds: ClassVar[frozenset[str]] = frozenset()

    @property
    def name(self) -> str:
        return type(self).__name__

    def check(self, ctx: Any) -> Refusal | None:
        raise NotImplementedError

    def refuse(self, reason: str, /, **data: Any) -> Refusal:
        return Refusal(self.name, reason, data)


def select(guards: Iterable[Guard], kind: str) -> list[Guard]:
    """The guards that apply to `kind`, in their list order."""
    return [g for g in guards if kind in g.kinds]


def first_refusal(guards: Sequence[Guard], ctx: Any) -> Refusal | None:
    for guard in guards:
        refusal = guard.check(ctx)
        if refusal is not None:
            return refusal
    return None
