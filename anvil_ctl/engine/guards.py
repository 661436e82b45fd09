"""Guards that several transaction kinds share; each refuses before the first mutation and changes
nothing. Guards that read a serve take an accessor (`which`) into the kind's arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from anvil_ctl.core.errors import AuthRejected
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.states import UNFINISHED_STATES
from anvil_ctl.core.steps import Guard, Refusal, StepContext
from anvil_ctl.engine.assertions import slot_assertions
from anvil_ctl.engine.serving import identity_drift, image_present, serving_problems
from anvil_ctl.engine.world import World

AnyCtx = StepContext[object, World, object]
"""The context of any plan: what a guard that every kind lists reads."""
C = TypeVar("C", bound=AnyCtx)
"""The context of the plan a guard is listed in (its accessor reads that plan's arguments)."""


class IncumbentArgs(Protocol):
    @property
    def slot(self) -> str: ...

    @property
    def incumbent(self) -> Identity | None: ...


class CandidateArgs(Protocol):
    @property
    def slot(self) -> str: ...

    @property
    def candidate(self) -> Identity | None: ...


class CandidateIsServing(Guard[StepContext[CandidateArgs, World, object]]):
    """The slot's loaded candidate, that exact container, runs alone on its slot and its binding
    serves exactly its model: only that is qualified or promoted."""

    def check(self, ctx: StepContext[CandidateArgs, World, object]) -> Refusal | None:
        cand = ctx.args.candidate
        if cand is None:
            return self.refuse(f"slot {ctx.args.slot} has no loaded candidate; run `anvilctl load` first")
        problems = serving_problems(ctx.world, cand)
        if problems:
            return self.refuse("candidate is not what the slot serves: " + "; ".join(problems))
        return None


class NoUnresolvedTransaction(Guard[AnyCtx]):
    """No mutation starts while another transaction is unfinished or waits for a person:
    its compensation could later undo what this one builds on."""

    def check(self, ctx: AnyCtx) -> Refusal | None:
        for rec in ctx.world.store.unresolved():
            if rec.id != ctx.tx_id:
                hint = (
                    "run `anvilctl recover`"
                    if rec.state in UNFINISHED_STATES
                    else f"a person must resolve it (`anvilctl resolve {rec.id[:8]} --by NAME --note TEXT`)"
                )
                return self.refuse(
                    f"transaction {rec.id[:8]} ({rec.kind}) is {rec.state.value}; {hint}",
                    tx_id=rec.id,
                    state=rec.state.value,
                )
        return None


class RollbackIdentityComplete(Guard[StepContext[IncumbentArgs, World, object]]):
    """A slot with a serve on it has a recorded rollback identity with every required field."""

    def check(self, ctx: StepContext[IncumbentArgs, World, object]) -> Refusal | None:
        ident = ctx.args.incumbent
        if ident is None:
            slot = ctx.world.config.slot(ctx.args.slot)
            if ctx.world.server.models(slot.base_url):
                return self.refuse(
                    f"slot {ctx.args.slot}: {slot.binding} is serving but no rollback identity "
                    "is recorded; adopt the serving container first (`anvilctl adopt`)"
                )
            return None
        missing = ident.missing()
        if missing:
            return self.refuse(f"rollback identity incomplete: missing {', '.join(missing)}", missing=missing)
        return None


class RollbackIdentityRestorable(Guard[C]):
    """The serve to bring back (the incumbent, or rollback's target) exists as the same
    container ID with the same image ID (still on the host) and config fingerprint."""

    def __init__(self, which: Callable[[C], Identity | None]) -> None:
        self.which = which

    def check(self, ctx: C) -> Refusal | None:
        ident = self.which(ctx)
        if ident is None:
            return None
        world = ctx.world
        short = ident.container_id[:12]
        drift = {d.field: d for d in identity_drift(world, ident)}
        if "container" in drift:
            return self.refuse(
                f"retained container {short} was removed; it cannot be restored",
                container_id=ident.container_id,
            )
        if "image_id" in drift:
            d = drift["image_id"]
            return self.refuse(
                f"retained container {short} image changed: recorded {d.recorded}, observed {d.observed}"
            )
        if not image_present(world, ident.image_id):
            return self.refuse(f"incumbent image {ident.image_id} is gone from the host")
        if "config_fingerprint" in drift:
            d = drift["config_fingerprint"]
            return self.refuse(
                f"retained container {short} config fingerprint drifted",
                recorded=d.recorded,
                observed=d.observed,
            )
        return None


class BaseVerified(Guard[C]):
    """A mutation starts from a verified base: the recorded serve passes every goal-closure
    assertion (`anvilctl recheck`), unless a person accepted the drift by name and reason."""

    def __init__(self, which: Callable[[C], Identity | None], *, routed: bool) -> None:
        self.which = which
        self.routed = routed

    def check(self, ctx: C) -> Refusal | None:
        ident = self.which(ctx)
        if ident is None:
            return None
        failed = [a for a in slot_assertions(ctx.world, ident, routed=self.routed) if not a.passed]
        if not failed or getattr(ctx.args, "accept_drift", None) is not None:
            return None
        named = "; ".join(f"{a.name} (observed {a.observed})" for a in failed)
        return self.refuse(
            f"slot {ident.slot} differs from its record: {named}; repair it first "
            "(`anvilctl recheck`, `anvilctl rollback`) or accept the drift with "
            "--accept-drift --by NAME --reason TEXT",
            drifted=[a.as_dict() for a in failed],
        )


class RouterConfigured(Guard[AnyCtx]):
    """The transaction routes: a host without a router has nothing to route to."""

    def check(self, ctx: AnyCtx) -> Refusal | None:
        if ctx.world.router is None:
            return self.refuse(f"{ctx.kind} needs a router: the host config's router.kind is 'none'")
        return None


class RouterCredentialsAccepted(Guard[AnyCtx]):
    """The router accepts our admin and client credentials (a 401/403 is config, not a model failure)."""

    def check(self, ctx: AnyCtx) -> Refusal | None:
        router = ctx.world.router
        if router is None:
            return None
        try:
            router.probe_credentials()
        except AuthRejected as exc:
            return self.refuse(str(exc), **exc.data)
        return None
