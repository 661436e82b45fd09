"""The guards every mutating transaction kind selects from, in the order they run.

Each refuses before the first mutation; none changes anything. Cheap local checks
come first so a refusal costs little; the router credential probe comes last
among them because it is the only one that talks to another process.
"""

from __future__ import annotations

from typing import Any, ClassVar

from anvil_ctl.core.errors import AuthRejected, NotFound
from anvil_ctl.core.guards import Guard, Refusal
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT, Identity
from anvil_ctl.core.states import UNFINISHED_STATES
from anvil_ctl.core.steps import StepContext
from anvil_ctl.engine.serving import Candidate
from anvil_ctl.engine.world import World

MUTATING = frozenset({"load", "promote", "rollback", "unload"})


def _world(ctx: StepContext) -> World:
    world: World = ctx.world
    return world


def _incumbent(ctx: StepContext) -> Identity | None:
    data = ctx.args.get("incumbent")
    return Identity.from_dict(data) if data else None


class NoUnresolvedTransaction(Guard):
    """No mutation starts while another transaction is unfinished or waits for a person:
    its compensation could later undo what this one builds on."""

    kinds: ClassVar[frozenset[str]] = MUTATING

    def check(self, ctx: StepContext) -> Refusal | None:
        for rec in _world(ctx).store.unresolved():
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


class RollbackIdentityComplete(Guard):
    """A slot with a serve on it has a recorded rollback identity with every required field."""

    kinds: ClassVar[frozenset[str]] = frozenset({"load", "promote"})

    def check(self, ctx: StepContext) -> Refusal | None:
        ident = _incumbent(ctx)
        if ident is None:
            world = _world(ctx)
            slot = world.config.slot(ctx.args["slot"])
            if world.engine.models(slot.base_url):
                return self.refuse(
                    f"slot {ctx.args['slot']}: {slot.binding} is serving but no rollback identity "
                    "is recorded; adopt the serving container first (`anvilctl adopt`)"
                )
            return None
        missing = ident.missing()
        if missing:
            return self.refuse(f"rollback identity incomplete: missing {', '.join(missing)}", missing=missing)
        return None


class RollbackIdentityRestorable(Guard):
    """The recorded incumbent container exists with the same image ID and config fingerprint."""

    kinds: ClassVar[frozenset[str]] = frozenset({"load", "promote", "rollback"})

    def check(self, ctx: StepContext) -> Refusal | None:
        ident = _incumbent(ctx) if ctx.kind != "rollback" else Identity.from_dict(ctx.args["target"])
        if ident is None:
            return None
        world = _world(ctx)
        try:
            info = world.runtime.inspect(ident.container_id)
        except NotFound:
            return self.refuse(
                f"retained container {ident.container_id[:12]} was removed; it cannot be restored",
                container_id=ident.container_id,
            )
        if info.image_id != ident.image_id:
            return self.refuse(
                f"retained container {ident.container_id[:12]} image changed: "
                f"recorded {ident.image_id}, observed {info.image_id}"
            )
        try:
            world.runtime.image(ident.image_id)
        except NotFound:
            return self.refuse(f"incumbent image {ident.image_id} is gone from the host")
        if info.fingerprint != ident.config_fingerprint:
            return self.refuse(
                f"retained container {ident.container_id[:12]} config fingerprint drifted",
                recorded=ident.config_fingerprint,
                observed=info.fingerprint,
            )
        return None


class CandidateImagePinned(Guard):
    """The candidate's image is present on the host with exactly the pinned ID or digest."""

    kinds: ClassVar[frozenset[str]] = frozenset({"load"})

    def check(self, ctx: StepContext) -> Refusal | None:
        cand = Candidate.from_dict(ctx.args["candidate"])
        ref = cand.spec.image
        try:
            image = _world(ctx).runtime.image(ref)
        except NotFound:
            return self.refuse(f"pinned image {ref} is not present on this host", image=ref)
        if ref.startswith("sha256:") and image.id != ref:
            return self.refuse(f"image {ref} resolves to {image.id}", image=ref)
        if "@sha256:" in ref and ref not in image.repo_digests:
            return self.refuse(f"image digest {ref} not among {list(image.repo_digests)}", image=ref)
        return None


class ModelCacheComplete(Guard):
    """A candidate that pins a model finds it complete in the model cache before anything stops."""

    kinds: ClassVar[frozenset[str]] = frozenset({"load"})

    def check(self, ctx: StepContext) -> Refusal | None:
        cand = Candidate.from_dict(ctx.args["candidate"])
        if not cand.model_identity:
            return None
        cache = _world(ctx).model_cache
        if cache is None:
            return self.refuse(
                f"recipe {cand.recipe} pins model {cand.model_identity} but the host config sets no "
                "model_cache_dir to verify it in"
            )
        report = cache.verify_identity(cand.model_identity)
        if not report.complete:
            return self.refuse(
                f"model cache incomplete for {cand.model_identity}: {'; '.join(report.problems)}",
                problems=list(report.problems),
            )
        return None


class BindingNotTaken(Guard):
    """No running container of this slot other than the incumbent holds the slot's binding."""

    kinds: ClassVar[frozenset[str]] = frozenset({"load"})

    def check(self, ctx: StepContext) -> Refusal | None:
        world = _world(ctx)
        ident = _incumbent(ctx)
        slot_name = ctx.args["slot"]
        others = [
            c
            for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: slot_name})
            if c.running and (ident is None or c.id != ident.container_id)
        ]
        if others:
            return self.refuse(
                f"slot {slot_name}: container {others[0].id[:12]} ({others[0].name}) is running "
                "besides the incumbent; unload it first",
                container_id=others[0].id,
            )
        binding = world.config.slot(slot_name)
        if (ident is None or not ctx.args.get("incumbent_running", True)) and world.engine.listening(
            binding.base_url
        ):
            return self.refuse(
                f"binding {binding.binding} accepts connections but no recorded serve runs there: "
                "something we do not own holds it"
            )
        if ident is not None:
            served = [m.id for m in world.engine.models(world.config.slot(slot_name).base_url)]
            if served and served != [ident.served_model]:
                return self.refuse(
                    f"binding {world.config.slot(slot_name).binding} serves {served}, "
                    f"not the recorded incumbent {ident.served_model!r}: something we do not own holds it"
                )
        return None


class ExtraGuards(Guard):
    """Guards contributed by optional subsystems (model cache, GPU ownership) via world.extras."""

    kinds: ClassVar[frozenset[str]] = MUTATING

    def check(self, ctx: StepContext) -> Refusal | None:
        for guard in _world(ctx).extras.get("guards", ()):
            if ctx.kind in guard.kinds:
                refusal: Refusal | None = guard.check(ctx)
                if refusal:
                    return refusal
        return None


class RouterCredentialsAccepted(Guard):
    """The router accepts our admin and client credentials (a 401/403 is config, not a model failure)."""

    kinds: ClassVar[frozenset[str]] = MUTATING

    def check(self, ctx: StepContext) -> Refusal | None:
        router = _world(ctx).router
        if router is None:
            return None
        try:
            router.probe_credentials()
        except AuthRejected as exc:
            return self.refuse(str(exc), **exc.data)
        return None


GUARDS: list[Guard] = [
    NoUnresolvedTransaction(),
    RollbackIdentityComplete(),
    RollbackIdentityRestorable(),
    CandidateImagePinned(),
    ModelCacheComplete(),
    BindingNotTaken(),
    ExtraGuards(),
    RouterCredentialsAccepted(),
]


def guards_for(kind: str) -> list[Guard]:
    from anvil_ctl.core.guards import select

    return select(GUARDS, kind)


def describe(kind: str) -> list[dict[str, Any]]:
    return [{"guard": g.name, "invariant": (type(g).__doc__ or "").strip()} for g in guards_for(kind)]
