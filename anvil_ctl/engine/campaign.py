"""Which phase a slot is in beside `serving` (`qualifying` after a committed load, `watching`,
a canary's `standby`), each judged by its own assertions rather than the serving ones. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_object, get_objects
from anvil_ctl.core.ports import Owner
from anvil_ctl.engine.assertions import Assertion, Observation, _check, slot_assertions
from anvil_ctl.engine.chain import Chain
from anvil_ctl.engine.owner import owner_alive
from anvil_ctl.engine.serving import (
    identity_drift,
    image_present,
    inspect_or_none,
    is_running,
    route_problems,
    tier_incumbent,
)
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import queries, snapshots

SERVING = "serving"
QUALIFYING = "qualifying"
WATCHING = "watching"
STANDBY = "standby"
PHASES = (SERVING, QUALIFYING, WATCHING, STANDBY)


@dataclass(frozen=True)
class Campaign:
    """A committed load not yet ended by a promote or rollback."""

    load_tx: str
    candidate: Identity
    incumbent: Identity | None
    """The retained incumbent the promote or rollback will decide about (None: the slot had none)."""

    def as_dict(self) -> JSONObject:
        return {
            "phase": QUALIFYING,
            "load_tx": self.load_tx,
            "candidate": self.candidate.container_id,
            "candidate_model": self.candidate.served_model,
            "incumbent": self.incumbent.container_id if self.incumbent else None,
        }


def campaign_of(world: World, slot: str) -> Campaign | None:
    """The slot's campaign in progress; None when it serves, or stands by after an undone canary."""
    store = world.store
    newest = store.newest_committed_revision(slot)
    if newest is None or newest[1] != "load":
        return None
    candidate = store.identity_of(newest[0], "candidate")
    if candidate is None:  # a load commits only after recording its candidate
        return None
    _, [last] = queries.slot_revisions(store, slot, store.host, newest=1)
    if (last["kind"], last["state"]) == ("canary", "compensated") and not is_running(
        world, candidate.container_id
    ):
        return None
    return Campaign(newest[0], candidate, world.store.current_identity(slot, "incumbent"))


@dataclass(frozen=True)
class Watch:
    """A promote open in `watching` (or left `interrupted` by a recover that failed)."""

    promote_tx: str
    candidate: Identity
    incumbent: Identity | None
    owner_pid: int
    owner_alive: bool | None
    """False: the owning process is gone and `recover` must resume the watch (None: another host's)."""
    state: str = WATCHING

    @property
    def needs_recover(self) -> bool:
        return self.owner_alive is False or self.state != WATCHING

    def as_dict(self) -> JSONObject:
        return {
            "phase": WATCHING,
            "promote_tx": self.promote_tx,
            "state": self.state,
            "candidate": self.candidate.container_id,
            "candidate_model": self.candidate.served_model,
            "incumbent": self.incumbent.container_id if self.incumbent else None,
            "owner_pid": self.owner_pid,
            "owner_alive": self.owner_alive,
            "needs": "recover" if self.needs_recover else None,
        }


def watch_of(world: World, slot: str, me: Owner) -> Watch | None:
    """The slot's open watched promote, None when none; `me` names this host."""
    rec = world.store.watching(slot)
    if rec is None:
        return None
    candidate = world.store.identity_of(rec.id, "incumbent")
    if candidate is None:  # a promote watches only after recording its candidate
        return None
    incumbent = world.store.identity_of(rec.id, "rollback")
    return Watch(rec.id, candidate, incumbent, rec.owner.pid, owner_alive(rec.owner, me), rec.state.value)


@dataclass(frozen=True)
class Standby:
    """A slot whose router tier another slot serves (a canary's pair)."""

    retained: Identity
    """The slot's incumbent, else its loaded candidate: stopped and retained."""
    serving: Identity

    def as_dict(self) -> JSONObject:
        return {
            "phase": STANDBY,
            "retained": self.retained.container_id,
            "served_by": self.serving.slot,
            "serving": self.serving.container_id,
            "serving_model": self.serving.served_model,
        }


def standby_of(world: World, slot: str) -> Standby | None:
    """The slot's standby, None when its serve runs (or it has none) or no other slot serves it."""
    store = world.store
    retained = store.current_identity(slot, "incumbent") or store.current_identity(slot, "candidate")
    if retained is None or is_running(world, retained.container_id):
        return None
    serving = tier_incumbent(world, slot)
    return None if serving is None else Standby(retained, serving)


def standby_assertions(world: World, standby: Standby) -> list[Assertion]:
    """The slot's serve stopped and retained intact; the tier routed to the other slot's."""
    out = [Assertion("standby", True, standby.as_dict())]
    _check(out, "serve_retained", lambda: _retained(world, standby.retained))
    if world.router is not None:
        _check(out, "tier_served", lambda: _served(world, standby.serving))
    return out


def _served(world: World, serving: Identity) -> Observation:
    problems = route_problems(world, serving)
    return not problems, {"slot": serving.slot, "problems": list(problems)}


def watch_assertions(world: World, watched: Watch) -> list[Assertion]:
    """Its owner alive, the candidate serving and routed, the old incumbent retained intact."""
    out = [Assertion("watch", not watched.needs_recover, watched.as_dict())]
    out += slot_assertions(world, watched.candidate, routed=True, role="candidate")
    incumbent = watched.incumbent
    if incumbent is not None:
        _check(out, "incumbent_retained", lambda: _retained(world, incumbent))
    return out


def campaign_assertions(world: World, campaign: Campaign, chain: Chain | None = None) -> list[Assertion]:
    """The candidate's assertions (not routed), the incumbent retained intact, the tier as the
    load left it; for an unfinished `load --promote` (`chain`), its owner still running it."""
    out = [Assertion("campaign", True, campaign.as_dict())]
    if chain is not None:
        out.append(Assertion("chain", not chain.interrupted, chain.as_dict()))
    out += slot_assertions(world, campaign.candidate, routed=False, role="candidate")
    incumbent = campaign.incumbent
    if incumbent is not None:
        _check(out, "incumbent_retained", lambda: _retained(world, incumbent))
    if world.router is not None:
        _check(out, "tier_as_loaded", lambda: _tier(world, campaign))
    return out


def _retained(world: World, ident: Identity) -> Observation:
    """Stopped (never removed), the same image ID and config fingerprint, the image present."""
    info = inspect_or_none(world, ident.container_id)
    drift: JSONObject = {
        d.field: {"recorded": d.recorded, "observed": d.observed} for d in identity_drift(world, ident)
    }
    present = image_present(world, ident.image_id)
    ok = not drift and info is not None and not info.running and present
    return ok, {
        "container_id": ident.container_id,
        "status": info.status if info else "absent",
        "drift": drift,
        "image_present": present,
    }


def _backends(view: JSONObject) -> list[JSONValue]:
    return [[b.get("url"), b.get("state")] for b in get_objects(view, "backends")]


def _tier(world: World, campaign: Campaign) -> Observation:
    """The tier's backends (URL, state) are what the load's after-snapshot recorded: drained."""
    assert world.router is not None
    cfg = world.config.slot(campaign.candidate.slot)
    now = _backends(world.router.view(cfg.router_tier))
    after = snapshots.of_transaction(world.store, campaign.load_tx).get("after")
    recorded: JSONValue = None
    if after is not None:
        try:
            slot_view = get_object(get_object(after.body, "slots"), campaign.candidate.slot)
            recorded = _backends(get_object(slot_view, "router"))
        except ValueError:  # a body of another shape: judged as if none was recorded
            recorded = None
    if recorded is None:  # no after-snapshot (a load finished by `recover`): nothing may admit
        ok = all(b[1] in ("drain", "maint") for b in now if isinstance(b, list))
    else:
        ok = now == recorded
    return ok, {"tier": cfg.router_tier, "backends": now, "recorded": recorded}
