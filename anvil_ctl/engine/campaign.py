"""Which phase a slot is in beside `serving` (`qualifying` after a committed load, `watching`,
a canary's `standby`), each judged by its own assertions rather than the serving ones; and an
interrupted `load --promote` (a `Chain`), the slot dark until `recover` finishes it. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_object, get_objects
from anvil_ctl.core.ports import Owner, TxRecord
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.assertions import Assertion, Observation, _check, slot_assertions
from anvil_ctl.engine.outcome import Outcome
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
from anvil_ctl.persistence.store import Store

if TYPE_CHECKING:  # `recheck` reads chains: the plans (and their arguments) stay unimported there
    from anvil_ctl.engine.plans.args import PromoteRequest, RollbackRequest

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


# -- an interrupted `load --promote` ------------------------------------------------------------

DIED_BEFORE_MUTATION = "owner died before the first mutation"
"""The reason `recover` gives a transaction whose owner died while its guards ran."""

SETTLING = frozenset({"adopt", "load", "promote", "canary", "rollback", "unload"})
"""The kinds that change what a slot serves: one begun after the load settles its chain."""

_CUT = frozenset({TxState.PLANNED, TxState.RUNNING, TxState.COMPENSATING, TxState.INTERRUPTED})
"""A promotion left in one of these by a dead owner is `recover`'s to end before the chain."""

NEEDS = "a `load --promote` was interrupted before its promotion; `anvilctl recover` finishes it"


@dataclass(frozen=True)
class Chain:
    """A committed load whose journaled promotion has not happened."""

    load_tx: str
    slot: str
    then: JSONObject
    """The promotion as the load journaled it (`PromoteRequest`'s journal form)."""
    incumbent: str | None
    """The load's running incumbent: what a promotion that does not commit brings back (None: none)."""
    owner: Owner
    owner_alive: bool | None
    """False: the process that ran the chain is gone (None: another host's)."""
    cut: tuple[str, ...] = ()
    """The chain's own transactions that their owner's death ended."""
    promoted: Outcome | None = None
    """A promotion a dead `recover` ran that did not route the candidate: the bring-back is left."""

    @property
    def promote(self) -> PromoteRequest:
        from anvil_ctl.engine.plans.args import PromoteRequest, from_json

        return replace(from_json(PromoteRequest, self.then), chain=self.load_tx)

    @property
    def interrupted(self) -> bool:
        return self.owner_alive is False

    def as_dict(self) -> JSONObject:
        return {
            "load_tx": self.load_tx,
            "approved_by": self.then.get("approved_by"),
            "incumbent": self.incumbent,
            "owner_pid": self.owner.pid,
            "owner_alive": self.owner_alive,
            "cut": list(self.cut),
            "promoted": self.promoted.tx_id if self.promoted is not None else None,
            "needs": NEEDS if self.interrupted else None,
        }


def chain_of(world: World, slot: str, me: Owner) -> Chain | None:
    """The slot's open chain, None when it has none; `me` names this host. Open: the slot's newest
    committed revision is a load that journaled its promotion (`LoadArgs.then`), and every later
    transaction of the slot is the chain's own (its arguments name the load) and either ended by
    its owner's death or is a promotion `recover` ran that did not route, its bring-back owed."""
    store = world.store
    newest = store.newest_committed_revision(slot)
    if newest is None or newest[1] != "load":
        return None
    load = store.record(newest[0])
    then = load.args.get("then")
    if not isinstance(then, dict):
        return None  # a plain load (or one journaled before chains were)
    incumbent = None
    if load.args.get("incumbent") and load.args.get("incumbent_running"):
        incumbent = str(get_object(load.args, "incumbent")["container_id"])
    cut: list[str] = []
    promoted: Outcome | None = None
    runners: list[Owner] = []  # another process's chain transactions, maybe still under way
    for later in queries.later_on_slot(store, load.id):
        if later["kind"] not in SETTLING:
            continue
        rec = store.record(later["tx_id"])
        named = named_load(rec)
        mine = named is None and later["kind"] == "promote" and rec.owner == load.owner
        if mine and _ended_by_death(rec, store):
            cut.append(rec.id)  # names no load: the owner tells (records from before they did)
            continue
        if named != load.id:
            return None  # a person, or another chain, settled it
        if _ended_by_death(rec, store):
            cut.append(rec.id)
            if rec.owner != load.owner and rec.state in _CUT:
                runners.append(rec.owner)
            continue
        if rec.kind == "promote" and rec.owner != load.owner and incumbent is not None:
            if rec.state in (TxState.COMMITTED, TxState.ROLLED_BACK):
                return None  # routed, or its watch rolled back by itself: settled
            history = queries.state_history(store, rec.id)
            reason = history[-1][1] if history else ""
            promoted = Outcome(kind="promote", state=rec.state, tx_id=rec.id, reason=reason)
            runners.append(rec.owner)  # recover ran it: its bring-back is owed
            continue
        return None  # the chain's own run, or a bring-back that ended by itself, settled it
    alive = owner_alive(load.owner, me)
    for runner in runners:
        if alive is False:
            alive = owner_alive(runner, me)  # a `recover` still finishing the chain runs it now
    return Chain(load.id, slot, then, incumbent, load.owner, alive, tuple(cut), promoted)


def named_load(rec: TxRecord) -> str | None:
    """The load whose chain `rec` belongs to, as its journaled arguments name it: a chain's
    promotion (`PromoteArgs.chain`) or its bring-back (`decided_by.undoes`); None: no load."""
    named: object = None
    if rec.kind == "promote":
        named = rec.args.get("chain")
    elif rec.kind == "rollback":
        decided = rec.args.get("decided_by")
        undoes = decided.get("undoes") if isinstance(decided, dict) else None
        if isinstance(undoes, dict) and undoes.get("kind") == "load":
            named = undoes.get("tx_id")
    return named if isinstance(named, str) else None


def _ended_by_death(rec: TxRecord, store: Store) -> bool:
    """A transaction its owner's death ended, or left for `recover` to end."""
    if rec.state in _CUT:
        return True
    if rec.state not in (TxState.REFUSED, TxState.COMPENSATED):
        return False
    history = queries.state_history(store, rec.id)
    return any(state == TxState.INTERRUPTED.value for state, _ in history) or (
        rec.state is TxState.REFUSED and history[-1][1] == DIED_BEFORE_MUTATION
    )


def open_chains(world: World, me: Owner) -> list[Chain]:
    """Every slot's interrupted chain, in the host config's slot order."""
    found = (chain_of(world, slot, me) for slot in world.config.slots)
    return [c for c in found if c is not None and c.interrupted]


# -- what `recover` does with one (`entry.recover` runs the transactions) -----------------------


def _ended(promoted: Outcome | None, why: str) -> tuple[str | None, str, str]:
    """(transaction, state, reason) of the promotion; None: refused before it was journaled, `why`."""
    if promoted is None:
        return None, TxState.REFUSED.value, why
    return promoted.tx_id or None, promoted.state.value, promoted.reason


def finished(chain: Chain, promoted: Outcome | None, why: str = "") -> JSONObject:
    """Recover's report of the chain's promotion."""
    tx, state, reason = _ended(promoted, why)
    return {
        "tx_id": tx or "",
        "kind": "promote",
        "state": state,
        "reason": f"finishes the interrupted `load --promote` of load {chain.load_tx}"
        + (f": {reason}" if reason else ""),
        "chain": chain.as_dict(),
    }


def bring_back(chain: Chain, promoted: Outcome | None, why: str, by: str) -> RollbackRequest | None:
    """The rollback that brings the load's incumbent back when the promotion did not route."""
    from anvil_ctl.engine.plans.args import RollbackRequest

    if chain.incumbent is None:
        return None
    if promoted is not None and promoted.state in (TxState.COMMITTED, TxState.ROLLED_BACK):
        return None  # promoted, or its watch rolled back to the incumbent by itself
    tx, state, reason = _ended(promoted, why)
    decided: JSONObject = {
        "policy": "recover",
        "by": by,
        "why": f"the interrupted `load --promote` of load {chain.load_tx}: its promotion "
        f"{tx or '(not journaled)'} ended {state} ({reason}); the load's incumbent is brought back "
        "so that the slot is not dark",
        "promotion": {"tx_id": tx, "state": state, "reason": reason},
        "undoes": {"kind": "load", "tx_id": chain.load_tx},
    }
    return RollbackRequest(slot=chain.slot, to=chain.incumbent, decided_by=decided)
