"""`recheck`: read-only goal-closure assertions on a slot, for cron.

Each assertion is a name, a pass flag and what was observed. Every run is
recorded (rechecks table) with its snapshot's SHA-256; `--textfile` writes
Prometheus node_exporter textfile metrics with `prometheus_client`, which
replaces the file atomically.

Each run also witnesses the audit chain's head after its own record (`SEQ:HASH`):
in its result, an `audit.head` log line and the textfile's `anvil_audit_head`
gauge, so a collector outside the database keeps heads that `anvilctl audit
verify --expect-head` can check later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from anvil_ctl.bootstrap import Context
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.engine.assertions import slot_assertions
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import rechecks

log = structlog.get_logger(__name__)


@dataclass
class RecheckResult:
    slot: str
    assertions: list[dict[str, Any]] = field(default_factory=list)
    snapshot_sha256: str = ""
    recheck_id: int | None = None
    audit_head: str = ""  # SEQ:HASH of the audit chain after this run's record

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
            "audit_head": self.audit_head,
        }


def recheck(ctx: Context, slot: str) -> RecheckResult:
    world: World = ctx.world()
    ctx.config.slot(slot)
    out = RecheckResult(slot=slot)
    ident = ctx.store.current_identity(slot, "incumbent")
    if ident is None:
        out.assertions.append({"name": "incumbent_recorded", "passed": False, "observed": None})
    else:
        out.assertions.extend(a.as_dict() for a in slot_assertions(world, ident))
    return _finish(ctx, world, out)


def _finish(ctx: Context, world: World, out: RecheckResult) -> RecheckResult:
    try:
        out.snapshot_sha256 = observe(world, [out.slot]).sha256
    except AnvilError as exc:  # the runtime itself is unreachable: that is drift, and recorded
        out.assertions.append({"name": "snapshot", "passed": False, "observed": str(exc)})
    out.recheck_id = rechecks.record_recheck(
        ctx.store,
        slot=out.slot,
        passed=out.passed,
        failed=out.failed,
        assertions=out.assertions,
        snapshot_sha256=out.snapshot_sha256,
    )
    head = ctx.store.head()
    out.audit_head = str(head)
    log.info("audit.head", seq=head.seq, hash=head.hash)
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
    if result.audit_head:
        seq, _, digest = result.audit_head.partition(":")
        head = Gauge(
            "anvil_audit_head",
            "The audit chain's last entry after the last recheck (value: its number; label: its hash).",
            ["hash"],
            registry=registry,
        )
        head.labels(hash=digest).set(int(seq))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
