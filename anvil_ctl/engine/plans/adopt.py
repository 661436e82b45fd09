"""`adopt`: record a serving container (started by hand or another tool) as the slot's incumbent.

One step, which changes only the record: the identity, and the GPU roles it owns.
Nothing on the host is touched, so there is nothing to undo and no guard beyond
the caller's observation that the container runs and its binding serves one model.
"""

from __future__ import annotations

from anvil_ctl.core.steps import NoMemo, Plan, Step, StepContext, StepResult
from anvil_ctl.engine import gpu_ownership
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import AdoptArgs
from anvil_ctl.engine.world import World

Ctx = StepContext[AdoptArgs, World, NoMemo]


def record_incumbent(ctx: Ctx) -> StepResult:
    ident = ctx.args.identity
    ctx.world.store.record_identity(ctx.tx_id, "incumbent", ident)
    gpu_ownership.record_ownership(ctx.world, ctx.tx_id, ident, None)
    return {"identity_digest": ident.digest}


def build(args: AdoptArgs, world: World) -> Plan[AdoptArgs, World, NoMemo]:
    return Plan(
        kind="adopt",
        args=args,
        steps=[Step("record-incumbent", record_incumbent, None, "record the serving container as incumbent")],
        memo=NoMemo(),
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        keeps_serving=False,  # only the record changes
    )
