"""`recheck`: goal-closure assertions on a slot, for cron; read-only unless a repair is asked for.

Each assertion is a name, a pass flag and what was observed. Every run is
recorded (rechecks table) with its snapshot's SHA-256; `--textfile` writes
Prometheus node_exporter textfile metrics with `prometheus_client`, which
replaces the file atomically.

One repair exists, and runs only when asked (`repair=("router",)`): when the
only serve-independent failures are the router's (the route is missing or
stale) while every assertion about the recorded serve itself passes, the
`reconcile` transaction re-applies the route, then the slot is rechecked. Both
rechecks are recorded; the second carries a `router_repair` entry naming the
transaction. Nothing else is ever repaired.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anvil_ctl.bootstrap import Context
from anvil_ctl.commands.reconcile import reconcile
from anvil_ctl.config import Slot
from anvil_ctl.core.errors import AnvilError, BadInput, NotFound
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE, Identity
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.serving import FieldDrift, identity_drift
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import records


@dataclass
class RecheckResult:
    slot: str
    assertions: list[dict[str, Any]] = field(default_factory=list)
    snapshot_sha256: str = ""
    recheck_id: int | None = None
    repair: dict[str, Any] | None = None
    """The router repair this recheck followed (its transaction and the recheck before it)."""

    @property
    def failed(self) -> list[str]:
        return [a["name"] for a in self.assertions if not a["passed"]]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 6

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "passed": self.passed,
            "failed": self.failed,
            "assertions": self.assertions,
            "snapshot_sha256": self.snapshot_sha256,
            "recheck_id": self.recheck_id,
            "repair": self.repair,
        }


def _check(out: RecheckResult, name: str, fn: Callable[[], tuple[bool, Any]]) -> None:
    try:
        ok, observed = fn()
    except AnvilError as exc:
        ok, observed = False, f"{type(exc).__name__}: {exc}"
    out.assertions.append({"name": name, "passed": bool(ok), "observed": observed})


REPAIRS = ("router",)
"""The repairs `recheck` may run when asked; each is a transaction kind of its own."""

ROUTER_ASSERTIONS = frozenset({"router_readiness", "route_holds", "routed_smoke"})
SERVE_ASSERTIONS = frozenset(
    {
        "incumbent_recorded",
        "incumbent_container_running",
        "image_id",
        "config_fingerprint",
        "served_model",
        "context_tokens",
        "loopback_binding",
        "health",
        "snapshot",
    }
)
"""Assertions about the recorded serve itself (and whether the host could be observed):
any of them failing means re-routing is not the fix, so no repair runs."""


def router_repairable(result: RecheckResult) -> bool:
    """The route is missing or stale while the recorded serve runs healthy."""
    failed = set(result.failed)
    return bool(failed & ROUTER_ASSERTIONS) and not failed & SERVE_ASSERTIONS


def recheck(ctx: Context, slot: str, *, repair: tuple[str, ...] = ()) -> RecheckResult:
    """Recheck the slot; with `repair=("router",)`, reconcile a failing route and recheck again."""
    unknown = sorted(set(repair) - set(REPAIRS))
    if unknown:
        raise BadInput(f"--repair {', '.join(unknown)}: expected one of {list(REPAIRS)}", field="repair")
    result = _recheck(ctx, slot)
    if "router" not in repair or not router_repairable(result):
        return result
    try:
        outcome = reconcile(ctx, slot)
        done: dict[str, Any] = {
            "tx_id": outcome.tx_id,
            "state": outcome.state.value,
            "reason": outcome.reason,
            "committed": outcome.state.value == "committed",
        }
    except AnvilError as exc:  # the host lock held by another mutator, say: nothing ran
        done = {"tx_id": None, "state": "not run", "reason": str(exc), "committed": False}
    repaired = {**done, "before_recheck_id": result.recheck_id, "failed_before": result.failed}
    return _recheck(ctx, slot, repair=repaired)


def _recheck(ctx: Context, slot: str, *, repair: dict[str, Any] | None = None) -> RecheckResult:
    world: World = ctx.world()
    cfg = ctx.config.slot(slot)
    out = RecheckResult(slot=slot)
    out.repair = repair
    if repair is not None:
        out.assertions.append({"name": "router_repair", "passed": repair["committed"], "observed": repair})
    ident = ctx.store.current_identity(slot, "incumbent")
    if ident is None:
        out.assertions.append({"name": "incumbent_recorded", "passed": False, "observed": None})
        return _finish(ctx, world, out)
    _container_checks(world, ident, out)
    _serving_checks(world, cfg, ident, out)
    if ident.gpu_roles:
        _gpu_checks(ctx, world, ident, out)
    if world.router is not None:
        _router_checks(world, cfg, ident, out)
    _host_checks(world, ident, out)
    return _finish(ctx, world, out)


def _container_checks(world: World, ident: Identity, out: RecheckResult) -> None:
    def drift() -> dict[str, FieldDrift]:
        return {d.field: d for d in identity_drift(world, ident, running=True)}

    def running() -> tuple[bool, Any]:
        found = drift()
        if "container" in found:
            return False, "absent"
        status = found["status"].observed if "status" in found else "running"
        return "status" not in found, {"container_id": ident.container_id, "status": status}

    def same(name: str, shown: Callable[[str], str]) -> Callable[[], tuple[bool, Any]]:
        def check() -> tuple[bool, Any]:
            found = drift()
            if "container" in found:
                raise NotFound(f"container {ident.container_id[:12]} is absent")
            d = found.get(name)
            return d is None, shown(str(d.observed) if d else str(getattr(ident, name)))

        return check

    _check(out, "incumbent_container_running", running)
    _check(out, "image_id", same("image_id", lambda v: v))
    _check(out, "config_fingerprint", same("config_fingerprint", lambda v: v[:16]))


def _serving_checks(world: World, cfg: Slot, ident: Identity, out: RecheckResult) -> None:
    def served() -> tuple[bool, Any]:
        models = [m.id for m in world.engine.models(cfg.base_url)]
        return models == [ident.served_model], models

    def context_tokens() -> tuple[bool, Any]:
        lens = [m.max_model_len for m in world.engine.models(cfg.base_url)]
        return lens in ([ident.context_tokens], [None]), lens

    def binding() -> tuple[bool, Any]:
        try:
            loop = ipaddress.ip_address(cfg.host).is_loopback
        except ValueError:
            loop = cfg.host == "localhost"
        return loop and ident.binding == cfg.binding, cfg.binding

    _check(out, "served_model", served)
    _check(out, "context_tokens", context_tokens)
    _check(out, "loopback_binding", binding)
    _check(out, "health", lambda: (world.engine.health(cfg.base_url, "/health"), cfg.base_url + "/health"))


def _gpu_checks(ctx: Context, world: World, ident: Identity, out: RecheckResult) -> None:
    def gpu_owner() -> tuple[bool, Any]:
        owners = records.gpu_owners(ctx.store)
        mine = {r: (owners.get(r) or {}).get("container_id") for r in ident.gpu_roles}
        return all(v == ident.container_id for v in mine.values()), mine

    def gpus_found() -> tuple[bool, Any]:
        if world.gpus is None:
            return False, "no GPU probe"
        seen = {g.uuid.lower() for g in world.gpus.gpus()}
        want = {ctx.config.gpu_roles[r].uuid.lower(): r for r in ident.gpu_roles}
        return set(want) <= seen, sorted(want[u] for u in want if u in seen)

    _check(out, "gpu_owner", gpu_owner)
    _check(out, "expected_gpus_found", gpus_found)


def _router_checks(world: World, cfg: Slot, ident: Identity, out: RecheckResult) -> None:
    router = world.router
    assert router is not None

    def readiness() -> tuple[bool, Any]:
        backends = router.view(cfg.router_tier).get("backends", [])
        urls = [b.get("url") for b in backends]
        observed = [b.get("observed_model") for b in backends]
        ok = router.ready() and urls == [cfg.base_url] and observed in ([ident.served_model], [None])
        return ok, {"ready": router.ready(), "backends": urls, "observed_models": observed}

    def smoke() -> tuple[bool, Any]:
        answer = router.routed_chat(cfg.aliases[0])
        ok = answer.status == 200 and answer.model == ident.served_model
        return ok, {"status": answer.status, "model": answer.model}

    def route_holds() -> tuple[bool, Any]:
        check = router.check_route(cfg.router_tier, cfg.base_url, ident.served_model)
        return check.holds, check.as_dict()

    _check(out, "router_readiness", readiness)
    _check(out, "route_holds", route_holds)
    _check(out, "routed_smoke", smoke)


def _host_checks(world: World, ident: Identity, out: RecheckResult) -> None:
    def no_candidate() -> tuple[bool, Any]:
        # A promoted candidate keeps its creation label; as the incumbent it is no candidate.
        labels = {LABEL_MANAGED: "true", LABEL_ROLE: "candidate"}
        running = [
            c.id[:12] for c in world.runtime.list(labels=labels) if c.running and c.id != ident.container_id
        ]
        return not running, running

    def residue() -> tuple[bool, Any]:
        files = [r.path for r in world.shm.residue()] if world.shm else []
        return not files, files

    _check(out, "no_candidate_running", no_candidate)
    _check(out, "shm_residue_zero", residue)


def _finish(ctx: Context, world: World, out: RecheckResult) -> RecheckResult:
    try:
        out.snapshot_sha256 = observe(world, [out.slot]).sha256
    except AnvilError as exc:  # the runtime itself is unreachable: that is drift, and recorded
        out.assertions.append({"name": "snapshot", "passed": False, "observed": str(exc)})
    out.recheck_id = records.record_recheck(
        ctx.store,
        slot=out.slot,
        passed=out.passed,
        failed=out.failed,
        assertions=out.assertions,
        snapshot_sha256=out.snapshot_sha256,
    )
    return out


def write_textfile(path: Path, result: RecheckResult, *, now: float) -> None:
    """node_exporter textfile metrics of one recheck, replaced atomically."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    passed = Gauge(
        "anvil_recheck_passed",
        "1 if every goal-closure assertion held on the last recheck.",
        ["slot"],
        registry=registry,
    )
    assertion = Gauge(
        "anvil_recheck_assertion", "1 if the named assertion held.", ["slot", "assertion"], registry=registry
    )
    stamp = Gauge(
        "anvil_recheck_timestamp_seconds", "When the last recheck ran.", ["slot"], registry=registry
    )
    passed.labels(slot=result.slot).set(int(result.passed))
    for a in result.assertions:
        assertion.labels(slot=result.slot, assertion=a["name"]).set(int(a["passed"]))
    stamp.labels(slot=result.slot).set(now)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
