"""Guards: small named checks that refuse a transaction before its first mutation.

Each docstring states the invariant; a guard reads through ports, returns None or a `Refusal`,
and changes nothing. A plan lists its guards cheap first; the first refusal stops the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

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
