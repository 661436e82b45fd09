"""`recheck`: read-only goal-closure assertions on a slot, for cron.

Each assertion is a name, a pass flag and what was observed. Every run is
recorded (rechecks table) with its snapshot's SHA-256; `--textfile` writes
Prometheus node_exporter textfile metrics atomically (write a temporary file in
the same directory, then rename).
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anvil_ctl.commands.context import Context
from anvil_ctl.core.errors import AnvilError, NotFound
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import records


@dataclass
class RecheckResult:
    slot: str
    assertions: list[dict[str, Any]] = field(default_factory=list)
    snapshot_sha256: str = ""
    recheck_id: int | None = None

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
        }


def _check(out: RecheckResult, name: str, fn: Callable[[], tuple[bool, Any]]) -> None:
    try:
        ok, observed = fn()
    except AnvilError as exc:
        ok, observed = False, f"{type(exc).__name__}: {exc}"
    out.assertions.append({"name": name, "passed": bool(ok), "observed": observed})


def recheck(ctx: Context, slot: str) -> RecheckResult:
    world: World = ctx.world()
    cfg = ctx.config.slot(slot)
    out = RecheckResult(slot=slot)
    ident = ctx.store.current_identity(slot, "incumbent")
    if ident is None:
        out.assertions.append({"name": "incumbent_recorded", "passed": False, "observed": None})
        return _finish(ctx, world, out)

    def container() -> Any:
        return world.runtime.inspect(ident.container_id)

    def retained() -> tuple[bool, Any]:
        try:
            c = container()
        except NotFound:
            return False, "absent"
        return c.running, {"container_id": c.id, "status": c.status}

    _check(out, "incumbent_container_running", retained)
    _check(out, "image_id", lambda: (container().image_id == ident.image_id, container().image_id))
    _check(
        out,
        "config_fingerprint",
        lambda: (container().fingerprint == ident.config_fingerprint, container().fingerprint[:16]),
    )

    def served() -> tuple[bool, Any]:
        models = world.engine.models(cfg.base_url)
        return [m.id for m in models] == [ident.served_model], [m.id for m in models]

    _check(out, "served_model", served)

    def context_tokens() -> tuple[bool, Any]:
        models = world.engine.models(cfg.base_url)
        lens = [m.max_model_len for m in models]
        return lens == [ident.context_tokens] or lens == [None], lens

    _check(out, "context_tokens", context_tokens)

    def binding() -> tuple[bool, Any]:
        host = cfg.host
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = host == "localhost"
        return loop and ident.binding == cfg.binding, cfg.binding

    _check(out, "loopback_binding", binding)
    _check(
        out,
        "health",
        lambda: (world.engine.health(cfg.base_url, "/health"), cfg.base_url + "/health"),
    )

    owners_fn = world.extras.get("gpu_owners")
    if ident.gpu_roles:

        def gpu_owner() -> tuple[bool, Any]:
            owners = owners_fn() if callable(owners_fn) else records.gpu_owners(ctx.store)
            mine = {r: (owners.get(r) or {}).get("container_id") for r in ident.gpu_roles}
            return all(v == ident.container_id for v in mine.values()), mine

        _check(out, "gpu_owner", gpu_owner)

        def gpus_found() -> tuple[bool, Any]:
            if world.gpus is None:
                return False, "no GPU probe"
            seen = {g.uuid.lower() for g in world.gpus.gpus()}
            want = {ctx.config.gpu_roles[r].uuid.lower(): r for r in ident.gpu_roles}
            return set(want) <= seen, sorted(want[u] for u in want if u in seen)

        _check(out, "expected_gpus_found", gpus_found)

    if world.router is not None:
        router = world.router

        def readiness() -> tuple[bool, Any]:
            view = getattr(router, "view", None)
            data = view(cfg.router_tier) if callable(view) else {}
            backends = data.get("backends", []) if isinstance(data, dict) else []
            urls = [b.get("url") for b in backends]
            observed = [b.get("observed_model") for b in backends]
            ok = (
                router.ready()
                and urls == [cfg.base_url]
                and observed in ([ident.served_model], [None])
            )
            return ok, {"ready": router.ready(), "backends": urls, "observed_models": observed}

        _check(out, "router_readiness", readiness)

        def smoke() -> tuple[bool, Any]:
            answer = router.routed_chat(cfg.aliases[0])
            return (
                answer.status == 200 and answer.model == ident.served_model,
                {"status": answer.status, "model": answer.model},
            )

        _check(out, "routed_smoke", smoke)

    def no_candidate() -> tuple[bool, Any]:
        running = [
            c.id[:12]
            for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_ROLE: "candidate"})
            if c.running
        ]
        return not running, running

    _check(out, "no_candidate_running", no_candidate)

    def residue() -> tuple[bool, Any]:
        files = [r.path for r in world.shm.residue()] if world.shm else []
        return not files, files

    _check(out, "shm_residue_zero", residue)
    return _finish(ctx, world, out)


def _finish(ctx: Context, world: World, out: RecheckResult) -> RecheckResult:
    out.snapshot_sha256 = observe(world, [out.slot]).sha256
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
    """node_exporter textfile metrics, replaced atomically."""
    slot = result.slot.replace('"', "")
    lines = [
        "# HELP anvil_recheck_passed 1 if every goal-closure assertion held on the last recheck.",
        "# TYPE anvil_recheck_passed gauge",
        f'anvil_recheck_passed{{slot="{slot}"}} {int(result.passed)}',
        "# HELP anvil_recheck_assertion 1 if the named assertion held.",
        "# TYPE anvil_recheck_assertion gauge",
        *(
            f'anvil_recheck_assertion{{slot="{slot}",assertion="{a["name"]}"}} {int(a["passed"])}'
            for a in result.assertions
        ),
        "# HELP anvil_recheck_timestamp_seconds When the last recheck ran.",
        "# TYPE anvil_recheck_timestamp_seconds gauge",
        f'anvil_recheck_timestamp_seconds{{slot="{slot}"}} {now:.3f}',
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".anvil-recheck-", suffix=".prom.tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
