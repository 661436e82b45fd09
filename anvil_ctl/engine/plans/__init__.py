"""Every transaction kind, in one explicit registry: its argument class and plan builder.

`recover` rebuilds an interrupted transaction from its journaled arguments through
this table, so any process that imports the engine can recover every kind;
nothing registers itself by being imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from anvil_ctl.core.jsontypes import JSONMapping
from anvil_ctl.core.steps import Plan
from anvil_ctl.engine.plans import ab, adopt, load, promote, qualify, reconcile, rollback, unload
from anvil_ctl.engine.plans.args import (
    AbArgs,
    AdoptArgs,
    LoadArgs,
    PromoteArgs,
    QualifyArgs,
    ReconcileArgs,
    RollbackArgs,
    UnloadArgs,
    from_json,
)
from anvil_ctl.engine.world import World

A = TypeVar("A")
"""A kind's frozen argument dataclass."""


class TxKind(Protocol):
    """What the registry offers of every kind, whatever its argument class."""

    @property
    def args(self) -> type[object]: ...

    def build(self, args: object, world: World) -> Plan[object, World, object]: ...

    def rebuild(self, journaled: JSONMapping, world: World) -> Plan[object, World, object]: ...


@dataclass(frozen=True)
class Kind(Generic[A]):
    """A transaction kind: the class its arguments are journaled as, and its plan builder."""

    args: type[A]
    builder: Callable[[A, World], Plan[A, World, object]]

    def build(self, args: object, world: World) -> Plan[A, World, object]:
        """The plan for `args`, which must be this kind's argument class (else a TypeError)."""
        if not isinstance(args, self.args):
            raise TypeError(f"expected {self.args.__name__} arguments, got {type(args).__name__}")
        return self.builder(args, world)

    def rebuild(self, journaled: JSONMapping, world: World) -> Plan[A, World, object]:
        """The plan of a transaction from its journaled arguments."""
        return self.builder(from_json(self.args, journaled), world)


KINDS: dict[str, TxKind] = {
    "adopt": Kind[AdoptArgs](AdoptArgs, adopt.build),
    "load": Kind[LoadArgs](LoadArgs, load.build),
    "promote": Kind[PromoteArgs](PromoteArgs, promote.build),
    "rollback": Kind[RollbackArgs](RollbackArgs, rollback.build),
    "qualify": Kind[QualifyArgs](QualifyArgs, qualify.build),
    "ab": Kind[AbArgs](AbArgs, ab.build),
    "unload": Kind[UnloadArgs](UnloadArgs, unload.build),
    "reconcile": Kind[ReconcileArgs](ReconcileArgs, reconcile.build),
}
