"""Every transaction kind, in one explicit registry: its argument class and plan builder.

`recover` rebuilds an interrupted transaction from its journaled arguments through
this table, so any process that imports the engine can recover every kind;
nothing registers itself by being imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Kind:
    """A transaction kind: the class its arguments are journaled as, and its plan builder."""

    args: type[Any]
    build: Callable[[Any, World], Plan[Any, World, Any]]

    def rebuild(self, journaled: dict[str, Any], world: World) -> Plan[Any, World, Any]:
        """The plan of a transaction from its journaled arguments."""
        return self.build(from_json(self.args, journaled), world)


KINDS: dict[str, Kind] = {
    "adopt": Kind(AdoptArgs, adopt.build),
    "load": Kind(LoadArgs, load.build),
    "promote": Kind(PromoteArgs, promote.build),
    "rollback": Kind(RollbackArgs, rollback.build),
    "qualify": Kind(QualifyArgs, qualify.build),
    "ab": Kind(AbArgs, ab.build),
    "unload": Kind(UnloadArgs, unload.build),
    "reconcile": Kind(ReconcileArgs, reconcile.build),
}
