"""The goal-closure assertions of a slot, one list for `recheck` and the `BaseVerified` guard;
an assertion that cannot observe fails with the reason. Also how a serve's context length is
observed (`observe_context`). Read-only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from anvil_ctl.config.host import Slot
from anvil_ctl.core.engine_profile import EngineProfile, engine_profile
from anvil_ctl.core.errors import AdapterError, AnvilError, NotFound
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_objects
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE
from anvil_ctl.engine.serving import (
    FieldDrift,
    identity_drift,
    routed_chain_problems,
    routed_expectation,
)
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import gpu_ledger


@dataclass(frozen=True)
class Assertion:
    name: str
    passed: bool
    observed: JSONValue

    def as_dict(self) -> JSONObject:
        return {"name": self.name, "passed": self.passed, "observed": self.observed}


Observation = tuple[bool, JSONValue]
"""What one check found: whether it passed, and what it observed."""


def _check(out: list[Assertion], name: str, fn: Callable[[], Observation]) -> None:
    try:
        ok, observed = fn()
    except AnvilError as exc:
        ok, observed = False, f"{type(exc).__name__}: {exc}"
    out.append(Assertion(name, bool(ok), observed))


def slot_assertions(
    world: World, ident: Identity, *, routed: bool = True, role: str = "incumbent"
) -> list[Assertion]:
    """Every assertion about `ident` serving its slot; `routed=False` leaves the router out (a
    loaded candidate is reached directly). `role` names the serve in the container assertion."""
    cfg = world.config.slot(ident.slot)
    out: list[Assertion] = []
    _container_checks(world, ident, out, role)
    _serving_checks(world, cfg, ident, out)
    if ident.gpu_roles:
        _gpu_checks(world, ident, out)
    if routed and world.router is not None:
        _router_checks(world, cfg, ident, out)
    _host_checks(world, ident, out)
    return out


def _container_checks(world: World, ident: Identity, out: list[Assertion], role: str) -> None:
    def drift() -> dict[str, FieldDrift]:
        return {d.field: d for d in identity_drift(world, ident, running=True)}

    def running() -> Observation:
        found = drift()
        if "container" in found:
            return False, "absent"
        status = found["status"].observed if "status" in found else "running"
        return "status" not in found, {"container_id": ident.container_id, "status": status}

    def same(name: str, shown: Callable[[str], str]) -> Callable[[], Observation]:
        def check() -> Observation:
            found = drift()
            if "container" in found:
                raise NotFound(f"container {ident.container_id[:12]} is absent")
            d = found.get(name)
            return d is None, shown(str(d.observed) if d else str(getattr(ident, name)))

        return check

    _check(out, f"{role}_container_running", running)
    _check(out, "image_id", same("image_id", lambda v: v))
    _check(out, "config_fingerprint", same("config_fingerprint", lambda v: v[:16]))


def _serving_checks(world: World, cfg: Slot, ident: Identity, out: list[Assertion]) -> None:
    profile = engine_profile(ident.engine_profile)

    def served() -> Observation:
        models = [m.id for m in world.server.models(cfg.base_url)]
        return models == [ident.served_model], list(models)

    def context_tokens() -> Observation:
        seen = observed_context(world, ident)
        return seen.matches(ident.context_tokens), seen.as_dict()

    def health() -> Observation:
        if profile.health_path is None:
            # No health route: an engine that loads before it listens is healthy when it lists
            # its model (`served_model` above says which).
            models: list[str] = [m.id for m in world.server.models(cfg.base_url)]
            return bool(models), {"health_route": None, "models": list(models)}
        return world.server.health(cfg.base_url, profile.health_path), cfg.base_url + profile.health_path

    def binding() -> Observation:
        try:
            loop = ipaddress.ip_address(cfg.host).is_loopback
        except ValueError:
            loop = cfg.host == "localhost"
        return loop and ident.binding == cfg.binding, cfg.binding

    _check(out, "served_model", served)
    _check(out, "context_tokens", context_tokens)
    _check(out, "loopback_binding", binding)
    _check(out, "health", health)


def _gpu_checks(world: World, ident: Identity, out: list[Assertion]) -> None:
    def gpu_owner() -> Observation:
        owners = gpu_ledger.gpu_owners(world.store)
        mine: JSONObject = {r: owners[r]["container_id"] if r in owners else None for r in ident.gpu_roles}
        return all(v == ident.container_id for v in mine.values()), mine

    def gpus_found() -> Observation:
        if world.gpus is None:
            return False, "no GPU probe"
        seen = {g.uuid.lower() for g in world.gpus.gpus()}
        want = {world.config.gpu_roles[r].uuid.lower(): r for r in ident.gpu_roles}
        return set(want) <= seen, list(sorted(want[u] for u in want if u in seen))

    _check(out, "gpu_owner", gpu_owner)
    _check(out, "expected_gpus_found", gpus_found)


def _router_checks(world: World, cfg: Slot, ident: Identity, out: list[Assertion]) -> None:
    router = world.router
    assert router is not None

    def readiness() -> Observation:
        backends = get_objects(router.view(cfg.router_tier), "backends")
        urls = [b.get("url") for b in backends]
        observed = [b.get("observed_model") for b in backends]
        ok = router.ready() and urls == [cfg.base_url] and observed in ([ident.served_model], [None])
        return ok, {"ready": router.ready(), "backends": urls, "observed_models": observed}

    def smoke() -> Observation:
        alias, expected = routed_expectation(world, ident)
        answer = router.routed_chat(alias)
        chain = routed_chain_problems(world, ident)
        ok = answer.status == 200 and answer.model == expected and not chain
        return ok, {
            "status": answer.status,
            "model": answer.model,
            "expected": expected,
            "chain": list(chain),
        }

    def route_holds() -> Observation:
        _alias, expected = routed_expectation(world, ident)
        check = router.check_route(cfg.router_tier, cfg.base_url, expected)
        return check.holds, check.as_dict()

    _check(out, "router_readiness", readiness)
    _check(out, "route_holds", route_holds)
    _check(out, "routed_smoke", smoke)


def _host_checks(world: World, ident: Identity, out: list[Assertion]) -> None:
    def no_candidate() -> Observation:
        # A promoted candidate keeps its creation label; as the incumbent it is no candidate.
        # Another slot's recorded candidate (a canary's pair qualifying beside this slot) is
        # that slot's campaign, judged by its own recheck.
        labels = {LABEL_MANAGED: "true", LABEL_ROLE: "candidate"}
        theirs = {ident.container_id} | {
            c.container_id
            for name in world.config.slots
            if name != ident.slot and (c := world.store.current_identity(name, "candidate")) is not None
        }
        running = [c.id[:12] for c in world.runtime.list(labels=labels) if c.running and c.id not in theirs]
        return not running, list(running)

    def residue() -> Observation:
        # Only our residue: files managed engines left and nobody holds. A database's
        # segments or any other program's file in /dev/shm never fail this.
        files = [r.path for r in world.shm.residue()] if world.shm else []
        return not files, list(files)

    _check(out, "no_candidate_running", no_candidate)
    _check(out, "shm_residue_zero", residue)


@dataclass(frozen=True)
class ContextObservation:
    """What the engine showed of its context length, and how it was seen."""

    value: int | None
    how: str
    """max_model_len | not-reported | refusal | accepted | probe-failed | unobservable"""
    detail: JSONValue = None

    def matches(self, recorded: int) -> bool:
        """True when nothing observed contradicts `recorded` (an engine that reports no
        length and has no other way to show it does not contradict it)."""
        if self.how in ("probe-failed", "accepted"):  # inconclusive
            return False
        return self.value is None or self.value == recorded

    def describe(self) -> str:
        """What was seen, in words: `reports max_model_len 2048`, `refuses ...`."""
        if self.how == "max_model_len":
            return f"reports max_model_len {self.value}"
        if self.how == "refusal":
            return f"refuses prompts of {self.value} tokens or more (context length {self.value})"
        if self.how == "accepted":
            words = self.detail.get("prompt_words") if isinstance(self.detail, dict) else None
            return f"accepted a prompt of {words} tokens (context longer than recorded)"
        if self.how == "probe-failed":
            return f"could not be probed for its context length: {self.detail}"
        return f"shows no context length ({self.how})"

    def as_dict(self) -> JSONObject:
        return {"value": self.value, "how": self.how, "detail": self.detail}


def observe_context(
    world: World, profile: EngineProfile, base_url: str, served_model: str, expected: int
) -> ContextObservation:
    """The context length the engine at `base_url` shows, the way `profile` says it shows: `models`
    (`max_model_len` in /v1/models), `refusal` (a prompt of the recorded length is refused with
    a 400 naming the real length, or accepted, which is drift too) or `none` (unobservable)."""
    if profile.context_source == "models":
        lens: list[int | None] = [m.max_model_len for m in world.server.models(base_url)]
        if len(lens) == 1 and lens[0] is not None:
            return ContextObservation(int(lens[0]), "max_model_len", list(lens))
        return ContextObservation(None, "not-reported", list(lens))
    if profile.context_source == "refusal":
        try:
            answer = world.server.probe_prompt(base_url, served_model, expected)
        except AdapterError as exc:
            return ContextObservation(None, "probe-failed", str(exc))
        detail: JSONObject = {"status": answer.status, "seconds": answer.seconds, "prompt_words": expected}
        if answer.status == 400:
            limit = profile.refused_context(answer.body)
            if limit is None:
                return ContextObservation(None, "probe-failed", {**detail, "body": answer.body[:300]})
            return ContextObservation(limit, "refusal", detail)
        if answer.status == 200:
            return ContextObservation(None, "accepted", detail)
        return ContextObservation(None, "probe-failed", {**detail, "body": answer.body[:300]})
    return ContextObservation(None, "unobservable", None)


def observed_context(world: World, ident: Identity) -> ContextObservation:
    """`observe_context` for a recorded serve on its slot's binding."""
    slot = world.config.slot(ident.slot)
    profile = engine_profile(ident.engine_profile)
    return observe_context(world, profile, slot.base_url, ident.served_model, ident.context_tokens)
