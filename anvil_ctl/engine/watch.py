"""The watch: samples taken at an interval against limits declared before the first one, a
verdict out. `watch` is the loop, blind to what a sample is; `route_sampler` is a watched
promote's sample: chats through the route, its container's restarts and fatal log lines, and
the router's failed answers.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from anvil_ctl.core.errors import AnvilError, NotFound
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_object, get_objects
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.store import Store
from anvil_ctl.qualify.logs import classify, patterns_for
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.watchpolicy import (
    DEFAULT,
    FUNCTIONAL_METRIC,
    Limit,
    WatchPolicy,
    breaches,
    metrics_of,
    qualified_values,
)

Sample = Mapping[str, JSONValue]
"""One sample as journaled: its `metrics` (metric -> value or None) and what it observed."""

Stop = Callable[[], JSONObject | None]
"""Who stopped the watch (a person's abort, a signal), or None to go on."""

Judge = Callable[[Sequence[Sample]], list[JSONObject]]
"""The breaches the newest samples show (none: go on)."""


@dataclass(frozen=True)
class Verdict:
    """How a watch ended: `healthy`, `breach` or `stopped`."""

    ended: str
    samples: int
    breaches: tuple[JSONObject, ...] = ()
    breaching: tuple[Sample, ...] = ()
    stopped_by: JSONObject | None = None

    @property
    def healthy(self) -> bool:
        return self.ended == "healthy"

    def as_dict(self) -> JSONObject:
        return {
            "ended": self.ended,
            "samples": self.samples,
            "breaches": [*self.breaches],
            "breaching_samples": [dict(s) for s in self.breaching],
            "stopped_by": self.stopped_by,
        }


def within(limits: Sequence[Limit], consecutive: int) -> Judge:
    """A serve held to absolute limits, each failed by `consecutive` samples in a row."""
    return lambda kept: breaches(limits, [metrics_of(s) for s in kept], consecutive)


def watch(
    *,
    duration_s: float,
    interval_s: float,
    consecutive: int,
    judge: Judge,
    take: Callable[[int], Sample],
    record: Callable[[Sample], None],
    stop: Stop,
    at_least: int = 1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.2,
) -> Verdict:
    """Sample until a breach, a stop, or `duration_s` has passed (see the module doc)."""
    end = clock() + duration_s
    kept: list[Sample] = []  # the newest `consecutive`: a breach is a run ending at the newest
    n = 0
    while True:
        who = stop()
        if who is not None:
            return Verdict("stopped", n, stopped_by=who)
        started = clock()
        sample = take(n)
        record(sample)
        n += 1
        kept = [*kept, sample][-consecutive:]
        found = judge(kept)
        if found:
            return Verdict("breach", n, tuple(found), tuple(kept))
        next_at = started + interval_s if n < at_least else min(started + interval_s, end)
        while clock() < next_at:
            who = stop()
            if who is not None:
                return Verdict("stopped", n, stopped_by=who)
            sleep(max(0.0, min(poll_s, next_at - clock())))
        if clock() >= end and n >= at_least:
            return Verdict("healthy", n)


def route_baseline(world: World, serve: Identity) -> JSONObject:
    """What a watch of `serve` starting now counts from: time, restarts, router errors."""
    try:
        restarts = world.runtime.logs(serve.container_id, max_lines=1, max_bytes=1024).restart_count
    except NotFound:
        restarts = 0
    return {
        "since": time.time(),
        "restarts_before": restarts,
        "router_errors_before": router_errors(world, serve),
    }


def route_sampler(
    world: World,
    serve: Identity,
    *,
    requests: int,
    max_tokens: int,
    limits: Sequence[Limit],
    baseline: Mapping[str, JSONValue] | None = None,
) -> Callable[[int], Sample]:
    """Sample `n` of a serve, against the `baseline` taken when the watch began (None: now)."""
    baseline = baseline or route_baseline(world, serve)
    route_sample = world.route_sample
    if route_sample is None:
        raise RuntimeError("a watch samples through the router: the world has no route_sample")
    alias = world.config.slot(serve.slot).aliases[0]
    functional = any(lim.metric == FUNCTIONAL_METRIC for lim in limits)
    since, restarts_before = float(str(baseline["since"])), int(str(baseline["restarts_before"]))
    errors_before = baseline.get("router_errors_before")
    patterns = patterns_for(serve.engine_profile or None)

    def passive() -> JSONObject:
        """The serve's container and the router's failed answers since the watch began."""
        now = router_errors(world, serve)
        errors = max(0, now - errors_before) if now is not None and isinstance(errors_before, int) else None
        try:
            log = world.runtime.logs(serve.container_id, max_lines=2000, max_bytes=1 << 20, since=since)
        except NotFound:
            return {
                "restarts": None,
                "container_down": 1,
                "fatal_log_lines": None,
                "router_errors": errors,
                "status": "absent",
            }
        found = classify(log.lines, patterns)
        return {
            "router_errors": errors,
            "restarts": max(0, log.restart_count - restarts_before) + int(log.oom_killed),
            "container_down": int(log.status != "running"),
            "fatal_log_lines": sum(found.fatal_counts.values()),
            "status": log.status,
            "oom_killed": log.oom_killed,
            "exit_code": log.exit_code,
            "fatal": [*found.fatal[:3]],
        }

    def take(n: int) -> Sample:
        active = route_sample(alias, requests, max_tokens, n if functional else None)
        signals = passive()
        metrics: JSONObject = {
            **{k: None if v is None else round(v, 4) for k, v in active.metrics().items()},
            **{k: signals[k] for k in ("restarts", "container_down", "fatal_log_lines", "router_errors")},
        }
        return {
            "n": n,
            "at": round(time.time(), 3),
            "metrics": metrics,  # the active sample's and the passive signals'
            "requests": active.as_dict()["requests"],
            "functional": [*active.functional],
            "passive": signals,
        }

    return take


def router_errors(world: World, serve: Identity) -> int | None:
    """The router's count of failed answers from the serve's binding (None: none to read)."""
    if world.router is None:
        return None
    slot = world.config.slot(serve.slot)
    try:
        return world.router.errors(slot.router_tier, slot.base_url)
    except AnvilError:
        return None


def standing_policy(store: Store, serve: Identity, profile: str | None) -> tuple[WatchPolicy, JSONObject]:
    """The `[watch]` table of the profile that qualified the serve (or `profile`'s), and its origin."""
    decision = qualification.latest_decision(store, serve.qualification_digest)
    chosen = profile or (decision["profile"] if decision else None)
    policy = load_profile(chosen).watch if chosen else DEFAULT
    origin: JSONObject = {"decision": decision["id"] if decision else None, "profile": chosen}
    return policy, origin


def qualified(store: Store, evidence_dir: Path, serve: Identity) -> tuple[dict[str, float], JSONObject]:
    """The qualified values relative limits resolve against, from the newest qualification's
    capacity artifact (when its SHA-256 matches the record), and which evidence they came from."""
    decision = qualification.latest_decision(store, serve.qualification_digest)
    tx_id = decision["tx_id"] if decision else None
    if not tx_id:
        return {}, {"evidence": None, "why": "no qualification recorded for this serve"}
    for gate in qualification.evidence(store, tx_id):
        path = Path(gate["artifact"])
        if not path.is_absolute():
            path = evidence_dir / tx_id / path
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        if gate["sha256"] and hashlib.sha256(raw).hexdigest() != gate["sha256"]:
            return {}, {"evidence": str(path), "why": "artifact differs from its recorded SHA-256"}
        try:
            cells = get_objects(get_object(json.loads(raw), "evidence"), "cells")
        except ValueError:
            continue
        if cells and all("concurrency" in c for c in cells):
            return qualified_values(cells), {"evidence": str(path), "gate": gate["gate"], "tx_id": tx_id}
    return {}, {"evidence": None, "tx_id": tx_id, "why": "the qualification measured no capacity cell"}


ABORT = "abort"
"""The watch event `promote --abort` journals in the watched transaction: a person's stop."""


class Interrupts:
    """SIGINT and SIGTERM, during a watch, become a person's stop (main thread only)."""

    def __init__(self) -> None:
        self.caught: JSONObject | None = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.caught is None:
            try:
                by = getpass.getuser()
            except (KeyError, OSError):
                by = f"uid {os.getuid()}"
            self.caught = {
                "by": by,
                "via": signal.Signals(signum).name,
                "reason": f"{signal.Signals(signum).name} to pid {os.getpid()} during the watch",
            }

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def stopper(store: Store, tx_id: str, interrupts: Interrupts, *, every_s: float = 1.0) -> Stop:
    """Who stopped the watch of `tx_id`: a signal, or an abort another process journaled in it."""
    looked = [float("-inf")]

    def stop() -> JSONObject | None:
        if interrupts.caught is not None:
            return interrupts.caught
        if time.monotonic() - looked[0] < every_s:
            return None
        looked[0] = time.monotonic()
        for ev in store.step_events(tx_id):
            if ev.step == "watch" and ev.event == ABORT:
                return {**ev.detail, "via": "promote --abort"}
        return None

    return stop
