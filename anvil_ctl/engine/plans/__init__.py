"""Every transaction kind, in one explicit registry: its request, arguments and plan. `prepare`
reads what its arguments need once; `recover` rebuilds any kind from its journaled arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from anvil_ctl.core.jsontypes import JSONMapping
from anvil_ctl.core.steps import Plan
from anvil_ctl.engine.plans import ab, adopt, canary, load, promote, qualify, reconcile, rollback, unload
from anvil_ctl.engine.plans.args import (
    AbArgs,
    AbRequest,
    AdoptArgs,
    AdoptRequest,
    CanaryArgs,
    CanaryRequest,
    LoadArgs,
    LoadRequest,
    PromoteArgs,
    PromoteRequest,
    QualifyArgs,
    QualifyRequest,
    ReconcileArgs,
    ReconcileRequest,
    RollbackArgs,
    RollbackRequest,
    UnloadArgs,
    UnloadRequest,
    from_json,
)
from anvil_ctl.engine.world import World

R = TypeVar("R")
"""A kind's request."""
A = TypeVar("A")
"""A kind's frozen argument dataclass."""

AnyPlan = Plan[object, World, object]


class TxKind(Protocol):
    """What the registry offers of every kind, whatever its request and argument classes."""

    @property
    def args(self) -> type[object]: ...

    @property
    def mutates(self) -> bool: ...

    def prepare(self, world: World, request: object) -> object: ...

    def build(self, args: object, world: World, request: object = None) -> AnyPlan: ...

    def rebuild(self, journaled: JSONMapping, world: World) -> AnyPlan: ...


@dataclass(frozen=True)
class Kind(Generic[R, A]):
    """A transaction kind: its request, arguments and plan; `mutates` kinds run under the host lock.
    `builder` gets the request too where the plan keeps what is never journaled (progress)."""

    request: type[R]
    args: type[A]
    preparer: Callable[[World, R], A]
    builder: Callable[[A, World, R | None], Plan[A, World, object]]
    mutates: bool = True

    def prepare(self, world: World, request: object) -> A:
        if not isinstance(request, self.request):
            raise TypeError(f"expected a {self.request.__name__}, got {type(request).__name__}")
        return self.preparer(world, request)

    def build(self, args: object, world: World, request: object = None) -> Plan[A, World, object]:
        """The plan for `args`, which must be this kind's argument class (else a TypeError)."""
        if not isinstance(args, self.args):
            raise TypeError(f"expected {self.args.__name__} arguments, got {type(args).__name__}")
        return self.builder(args, world, request if isinstance(request, self.request) else None)

    def rebuild(self, journaled: JSONMapping, world: World) -> Plan[A, World, object]:
        return self.builder(from_json(self.args, journaled), world, None)


KINDS: dict[str, TxKind] = {
    "adopt": Kind[AdoptRequest, AdoptArgs](AdoptRequest, AdoptArgs, adopt.prepare, adopt.build),
    "load": Kind[LoadRequest, LoadArgs](LoadRequest, LoadArgs, load.prepare, load.build),
    "promote": Kind[PromoteRequest, PromoteArgs](PromoteRequest, PromoteArgs, promote.prepare, promote.build),
    "canary": Kind[CanaryRequest, CanaryArgs](CanaryRequest, CanaryArgs, canary.prepare, canary.build),
    "rollback": Kind[RollbackRequest, RollbackArgs](
        RollbackRequest, RollbackArgs, rollback.prepare, rollback.build
    ),
    "qualify": Kind[QualifyRequest, QualifyArgs](
        QualifyRequest, QualifyArgs, qualify.prepare, qualify.build, mutates=False
    ),
    "ab": Kind[AbRequest, AbArgs](AbRequest, AbArgs, ab.prepare, ab.build, mutates=False),
    "unload": Kind[UnloadRequest, UnloadArgs](UnloadRequest, UnloadArgs, unload.prepare, unload.build),
    "reconcile": Kind[ReconcileRequest, ReconcileArgs](
        ReconcileRequest, ReconcileArgs, reconcile.prepare, reconcile.build
    ),
}
