"""`recheck`: read-only goal-closure assertions on a slot, for cron, each run recorded.

The slot is judged by its phase (`engine.campaign`). A recheck that cannot observe is neither
drift nor a pass: `anvil_recheck_up 0`, exit 7. The one repair (`router`, only when asked and
never during a watch) reconciles a failing route and rechecks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from anvil_ctl.atomic import atomic_write
from anvil_ctl.bootstrap import App
from anvil_ctl.core.errors import AnvilError, AuthRejected, BadInput, Unavailable
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT
from anvil_ctl.core.states import ExitCode
from anvil_ctl.engine.assertions import slot_assertions
from anvil_ctl.engine.campaign import (
    PHASES,
    QUALIFYING,
    SERVING,
    STANDBY,
    WATCHING,
    campaign_assertions,
    campaign_of,
    chain_of,
    standby_assertions,
    standby_of,
    watch_assertions,
    watch_of,
)
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.serving import pauses
from anvil_ctl.engine.world import World, one_reading
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import rechecks

if TYPE_CHECKING:  # `recheck --slo` only: the official client and the profiles import with it
    from anvil_ctl.commands.slo import Enablement

log = get_logger(__name__)


@dataclass(frozen=True)
class SloRequest:
    """`recheck --slo`: sample the route against the serve's thresholds (`commands.slo`)."""

    profile: str | None = None
    rollback_on_breach: Enablement | None = None


@dataclass
class RecheckResult:
    slot: str
    assertions: list[JSONObject] = field(default_factory=list)
    """Each: `name`, `passed` (a bool) and what was `observed`."""
    snapshot_sha256: str = ""
    recheck_id: int | None = None
    unavailable: str | None = None
    """Why the host could not be observed (a dependency unavailable); None when it was."""
    repair: JSONObject | None = None
    """The router repair this recheck followed (its transaction and the recheck before it)."""
    phase: str = SERVING

    @property
    def up(self) -> bool:
        """Whether the recheck could observe the host at all."""
        return self.unavailable is None

    audit_head: str = ""  # SEQ:HASH of the audit chain after this run's record

    @property
    def failed(self) -> list[str]:
        return [str(a["name"]) for a in self.assertions if not a["passed"]]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def needs_recover(self) -> bool:
        """A watched promote whose owner is gone (`recover` resumes it), or a `load --promote`
        whose process died before its promotion (`recover` finishes it)."""
        failed = self.failed
        return (self.phase == WATCHING and "watch" in failed) or (
            self.phase == QUALIFYING and "chain" in failed
        )

    @property
    def exit_code(self) -> int:
        if not self.up:
            return ExitCode.UNAVAILABLE
        if self.needs_recover:
            return ExitCode.NEEDS_OPERATOR
        return ExitCode.OK if self.passed else ExitCode.DRIFT

    def as_dict(self) -> dict[str, object]:
        """What `recheck --json` prints."""
        return {**asdict(self), "passed": self.passed, "failed": self.failed, "up": self.up}


REPAIRS = ("router",)

ROUTER_ASSERTIONS = frozenset({"router_readiness", "route_holds", "routed_smoke"})
SERVE_ASSERTIONS = frozenset(
    {
        "observed",
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
    """The route is missing or stale while the recorded serve runs healthy; a refusal of our
    credentials says nothing about the route (the repair would be refused the same way)."""
    failed = set(result.failed)
    serving = result.up and result.phase == SERVING
    refused = any(
        str(a["observed"]).startswith(f"{AuthRejected.__name__}:")
        for a in result.assertions
        if a["name"] in ROUTER_ASSERTIONS and not a["passed"]
    )
    return serving and bool(failed & ROUTER_ASSERTIONS) and not failed & SERVE_ASSERTIONS and not refused


def wait_router(app: App, timeout_s: float) -> float:
    """Wait until the router answers our admin credentials (a router is reported started before
    it listens); the seconds it took, Unavailable at the deadline."""
    world = app.world()
    if world.router is None:
        return 0.0
    started = time.monotonic()
    for pause in pauses(world.config.policy.health_poll_s):
        try:
            world.router.probe_credentials()
            return time.monotonic() - started
        except AuthRejected:
            raise
        except AnvilError as exc:
            if time.monotonic() - started >= timeout_s:
                raise Unavailable(
                    f"the router did not answer within {timeout_s:g} s: {exc}", dependency="router"
                ) from None
        time.sleep(pause)
    raise AssertionError("pauses() never ends")


def recheck(
    app: App,
    slot: str,
    *,
    repair: tuple[str, ...] = (),
    slo: SloRequest | None = None,
    wait_router_s: float | None = None,
) -> RecheckResult:
    """Recheck the slot; `repair=("router",)` reconciles a failing route and rechecks, `slo`
    samples the route too, `wait_router_s` first waits for the router to answer."""
    unknown = sorted(set(repair) - set(REPAIRS))
    if unknown:
        raise BadInput(f"--repair {', '.join(unknown)}: expected one of {list(REPAIRS)}", field="repair")
    app.config.slot(slot)
    if slo is not None and slo.profile is not None:
        from anvil_ctl.qualify.profiles import load_profile

        load_profile(slo.profile)  # a wrong --profile is bad input before anything is observed
    result = _recheck(app, slot, slo=slo, wait_router_s=wait_router_s)
    if "router" not in repair or not router_repairable(result):
        return result
    # Imported here: a plain recheck from cron has no use for the transaction machinery.
    from anvil_ctl.commands.transactions import reconcile

    try:
        outcome = reconcile(app, slot)
        done: JSONObject = {
            "tx_id": outcome.tx_id,
            "state": outcome.state.value,
            "reason": outcome.reason,
            "committed": outcome.state.value == "committed",
        }
    except AnvilError as exc:  # the host lock held by another mutator, say: nothing ran
        done = {"tx_id": None, "state": "not run", "reason": str(exc), "committed": False}
    repaired: JSONObject = {
        **done,
        "before_recheck_id": result.recheck_id,
        "failed_before": list(result.failed),
    }
    return _recheck(app, slot, repair=repaired, slo=slo)


def _recheck(
    app: App,
    slot: str,
    *,
    repair: JSONObject | None = None,
    slo: SloRequest | None = None,
    wait_router_s: float | None = None,
) -> RecheckResult:
    app.config.slot(slot)  # an unknown slot is bad input: nothing observed, nothing recorded
    out = RecheckResult(slot=slot, repair=repair)
    if repair is not None:
        out.assertions.append({"name": "router_repair", "passed": repair["committed"], "observed": repair})
    try:
        if wait_router_s is not None:  # a router that does not answer: not observable, as below
            log.info("recheck.router_answered", waited_s=round(wait_router(app, wait_router_s), 3))
        world: World = app.world()
        # The runtime must answer before anything it says is judged: an unreachable Docker
        # Engine is "could not observe", never drift.
        world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: slot})
        ident = app.store.current_identity(slot, "incumbent")
        watched = watch_of(world, slot, app.owner)
        campaign = campaign_of(world, slot) if watched is None else None
        standby = standby_of(world, slot) if watched is None and campaign is None else None
        with one_reading(world):  # assertions and snapshot only observe: /dev/shm scanned once
            if watched is not None:
                out.phase = WATCHING
                out.assertions.extend(a.as_dict() for a in watch_assertions(world, watched))
            elif campaign is not None:
                out.phase = QUALIFYING
                chain = chain_of(world, slot, app.owner)
                out.assertions.extend(a.as_dict() for a in campaign_assertions(world, campaign, chain))
            elif standby is not None:
                out.phase = STANDBY
                out.assertions.extend(a.as_dict() for a in standby_assertions(world, standby))
            elif ident is None:
                out.assertions.append({"name": "incumbent_recorded", "passed": False, "observed": None})
            else:
                out.assertions.extend(a.as_dict() for a in slot_assertions(world, ident))
            try:
                out.snapshot_sha256 = observe(world, [out.slot]).sha256
            except Unavailable:
                raise
            except AnvilError as exc:  # observed, but something in it is broken: drift, recorded
                out.assertions.append({"name": "snapshot", "passed": False, "observed": str(exc)})
        if slo is not None:
            out.assertions.append(_slo(app, out, ident, slo))
    except Unavailable as exc:
        kept = out.assertions[:1] if repair is not None else []  # the repair entry stays
        out.assertions = [*kept, {"name": "observed", "passed": False, "observed": str(exc)}]
        out.snapshot_sha256, out.unavailable = "", str(exc)
    try:
        _record(app, out)
    except Unavailable as exc:  # the state database itself: the textfile still says so
        if out.up:
            out.unavailable = str(exc)
    return out


def _slo(app: App, out: RecheckResult, ident: Identity | None, slo: SloRequest) -> JSONObject:
    """The `slo` assertion: sampled only where the route should serve the recorded incumbent
    and every other assertion holds (a route known broken needs no sample to say so)."""
    if out.phase != SERVING or ident is None:
        why = {
            QUALIFYING: "a campaign is in progress: the route serves nothing until promote",
            WATCHING: "a watch samples the route against its own limits",
            STANDBY: "another slot of the tier serves it",
        }.get(out.phase, "no incumbent")
        return {"name": "slo", "passed": out.phase != SERVING, "observed": {"skipped": why}}
    if out.failed:
        return {"name": "slo", "passed": False, "observed": {"skipped": f"failed first: {out.failed}"}}
    from anvil_ctl.commands.slo import slo_check

    held, observed = slo_check(app, ident, profile=slo.profile, rollback_on_breach=slo.rollback_on_breach)
    return {"name": "slo", "passed": held, "observed": observed}


def _record(app: App, out: RecheckResult) -> None:
    out.recheck_id = rechecks.record_recheck(
        app.store,
        slot=out.slot,
        passed=out.passed,
        failed=out.failed,
        assertions=out.assertions,
        snapshot_sha256=out.snapshot_sha256,
    )
    head = app.store.head()
    out.audit_head = str(head)
    log.info("audit.head", seq=head.seq, hash=head.hash)


def write_textfile(path: Path, result: RecheckResult, *, now: float) -> None:
    """node_exporter textfile metrics of one recheck, replaced atomically; the directory is
    never created (a typo must not grow a tree)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()

    def gauge(name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    up = gauge(
        "anvil_recheck_up",
        "1 if the last recheck could observe the host; 0 if a dependency was unavailable.",
        "slot",
    )
    passed = gauge(
        "anvil_recheck_passed", "1 if every goal-closure assertion held on the last recheck.", "slot"
    )
    assertion = gauge("anvil_recheck_assertion", "1 if the named assertion held.", "slot", "assertion")
    stamp = gauge("anvil_recheck_timestamp_seconds", "When the last recheck ran.", "slot")
    phase = gauge(
        "anvil_recheck_phase",
        "1 for the phase the last recheck judged the slot in (serving, qualifying, watching, standby).",
        "slot",
        "phase",
    )
    for name in PHASES:
        phase.labels(slot=result.slot, phase=name).set(int(result.up and result.phase == name))
    up.labels(slot=result.slot).set(int(result.up))
    passed.labels(slot=result.slot).set(int(result.up and result.passed))
    if result.up:
        for a in result.assertions:
            assertion.labels(slot=result.slot, assertion=a["name"]).set(int(bool(a["passed"])))
    stamp.labels(slot=result.slot).set(now)
    if result.audit_head:
        seq, _, digest = result.audit_head.partition(":")
        head = gauge(
            "anvil_audit_head",
            "The audit chain's last entry after the last recheck (value: its number; label: its hash).",
            "hash",
        )
        head.labels(hash=digest).set(int(seq))
    try:
        atomic_write(path, generate_latest(registry))
    except OSError as exc:
        raise Unavailable(
            f"recheck textfile {path} cannot be written: {exc.strerror or exc}", dependency="textfile"
        ) from None
