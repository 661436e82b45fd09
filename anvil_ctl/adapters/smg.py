"""Router adapter for the SGLang/Shepherd Model Gateway (`smg` 1.13) `/workers` API.

A tier is the worker label `anvil.tier`: one backend, registered with its first alias as model
id. Warnings: a DELETE queues a removal keyed by URL that nothing cancels and that removes
whatever is registered there when it lands, so a worker whose removal is pending is never
DELETEd again and readmission holds (`removal_hold_s`, or `hold=True` from a caller that cannot
know what a dead process sent). Health can say yes while routed chat answers 503 (an open
circuit breaker), and registrations live in memory: readmission ends only with a routed 200
from the expected model, registering again as needed. A drain parks the tier's alias at the
parking responder (`smg_parking`): clients get a retryable 503, never a 404."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.engine_http import context_for, metric_samples
from anvil_ctl.adapters.router_http import (
    NotYetRouted,
    RouterHttp,
    check_answer,
    probe_client_token,
    readmit_loop,
    routed_chat,
)
from anvil_ctl.adapters.smg_parking import ParkingResponder
from anvil_ctl.adapters.smg_workers import (
    DEFAULT_SETTLE_S,
    NIL_WORKER_ID,
    PARKED_LABEL,
    TIER_LABEL,
    SmgWorker,
    SmgWorkers,
    norm,
)
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import Backend, Readmission, RouteCheck, RoutedAnswer
from anvil_ctl.log import get_logger

log = get_logger()

POLL_S = 0.05
POLL_FIRST_S = 0.005
WAIT_POLL_MAX_S = 0.01
"""A wait for smg to list or remove a worker polls from `POLL_FIRST_S`, doubling up to this: a
removal in a drain starts the clients' window, which a longer pause would stretch by up to one
pause (a `GET /workers` on loopback takes about a millisecond)."""
APPEAR_TIMEOUT_S = 10.0
PARK_SETTLE_S = 3600
"""A parked worker's drain: how long smg answers 503 for a tier left parked by an ended process."""


class SmgRouter(RouterHttp):
    """`anvil_ctl.core.ports.Router` over smg's HTTP control and data planes."""

    NAME = "smg"
    READY_PATH = "/readiness"

    def __init__(
        self,
        url: str,
        credentials: RouterCredentials,
        *,
        admin_url: str | None = None,
        metrics_url: str | None = None,
        transport: httpx.BaseTransport | None = None,
        removal_timeout_s: float = 30.0,
        removal_hold_s: float = 6.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = norm(url)
        self.admin_url = norm(admin_url or url)
        self.metrics_url = metrics_url
        self._client: Secret = credentials.client
        self._http = httpx.Client(
            transport=transport, timeout=10.0, verify=context_for(self.url, self.admin_url)
        )
        self._workers = SmgWorkers(self._http, self.admin_url, credentials.require_admin())
        self._removal_timeout_s = removal_timeout_s
        self._hold_s = removal_hold_s
        self._sleep = sleep
        self._clock = clock
        self._pending: dict[str, float] = {}
        """URL -> since when a removal may be pending there: readmission holds `removal_hold_s` past it."""
        self._parking: ParkingResponder | None = None
        self._parked: dict[str, str] = {}
        """tier -> the parked worker this process registered for it and has not removed."""
        self._holding: dict[str, str] = {}
        """tier -> the key of its park that holds requests for this process's next route."""

    def close(self) -> None:
        """A tier still parked stays parked by smg itself (its worker draining, see above)."""
        for tier, worker_id in list(self._parked.items()):
            try:
                self._workers.call("DELETE", f"/workers/{worker_id}")
                log.info("router.smg.left_parked", tier=tier, seconds=PARK_SETTLE_S)
            except AdapterError as exc:
                log.warning("router.smg.left_parked_failed", tier=tier, error=str(exc))
        self._parked.clear()
        super().close()
        if self._parking is not None:
            self._parking.close()

    def _removal_pending(self, worker: SmgWorker) -> bool:
        """smg will remove this worker's URL (it drains, or a RemoveWorker job is queued); remembered."""
        pending = worker.draining or self._workers.removal_queued(worker)
        if pending:
            self._may_remove(worker.url, self._clock())
        return pending

    def _may_remove(self, url: str, since: float) -> None:
        """Note a removal of `url` that may be pending since `since` (logged once per hold)."""
        noted = self._pending.get(url)
        if noted is None or since >= noted + self._hold_s:
            log.info("router.smg.removal_pending", url=url)
        self._pending[url] = since if noted is None else max(noted, since)

    def _hold_until(self, url: str, since: float | None) -> float | None:
        """When every removal that may be pending for `url` (or since `since`) has surely landed."""
        reasons = [t for t in (since, self._pending.get(url)) if t is not None]
        return max(reasons) + self._hold_s if reasons else None

    def _remove(self, worker: SmgWorker) -> None:
        """Remove a worker and wait until its URL is gone; one whose removal is pending is not DELETEd."""
        worker_id, url = worker.id, worker.url
        landed = self._removal_pending(worker)  # a pending removal is noted where it is seen
        sent = self._clock()
        if not landed:
            response = self._workers.call("DELETE", f"/workers/{worker_id}")
            if response.status_code not in (200, 202, 204, 404):
                raise AdapterError(
                    f"smg DELETE /workers/{worker_id} answered {response.status_code}",
                    status=response.status_code,
                )
            log.info("router.smg.remove", url=url, worker_id=worker_id)
        try:
            self._wait(lambda: self._workers.at(url) is None, self._removal_timeout_s, f"{url} removed")
            # Gone sooner than its drain: someone else's DELETE removed it, ours is still queued.
            landed = landed or self._clock() - sent >= min(worker.settle_s, DEFAULT_SETTLE_S)
            if not landed:
                log.warning("router.smg.early_removal", url=url, seconds=round(self._clock() - sent, 3))
        finally:
            if not landed:
                self._may_remove(url, sent)

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = self._clock() + timeout_s
        pause = POLL_FIRST_S
        while not done():
            if self._clock() >= end:
                raise TransientError(f"smg: timed out after {timeout_s:.0f} s waiting for {what}")
            self._sleep(pause)
            pause = min(pause * 2, WAIT_POLL_MAX_S)

    def _post(self, url: str, aliases: tuple[str, ...], label: str, tier: str, settle_s: int = 0) -> None:
        """Register a worker labelled `label`=`tier` and wait until smg lists it."""
        body: JSONObject = {
            "url": norm(url),
            "models": [{"id": alias} for alias in aliases],
            "labels": {label: tier},
            "health": {"drain_settle_secs": settle_s},
        }
        response = self._workers.call("POST", "/workers", json=body)
        if response.status_code == 409:
            # A removal of the same URL still pending: wait for it, then post again.
            raise TransientError(f"smg POST /workers {url}: a worker for this URL is still listed")
        if response.status_code not in (200, 201, 202):
            raise AdapterError(
                f"smg POST /workers {url} answered {response.status_code}: {response.text[:200]}",
                status=response.status_code,
            )
        log.info("router.smg.register", tier=tier, url=norm(url), aliases=list(aliases), label=label)
        self._wait(lambda: self._workers.at(url) is not None, APPEAR_TIMEOUT_S, f"{url} listed")

    @staticmethod
    def _matches(worker: SmgWorker, tier: str, aliases: tuple[str, ...]) -> bool:
        return worker.tier == tier and worker.aliases[:1] == aliases[:1] and not worker.draining

    def probe_credentials(self) -> None:
        """Admin: DELETE of the nil worker id (404 proves the admin role); client: a chat to an alias no
        tier serves (404 proves the key). 401/403 raise AuthRejected."""
        response = self._workers.call("DELETE", f"/workers/{NIL_WORKER_ID}")
        if response.status_code not in (404, 200, 202):
            raise AdapterError(f"smg admin probe answered {response.status_code}")
        probe_client_token(self._http, self.url, self._client)

    def _listed(self, tier: str) -> list[tuple[Backend, JSONValue]]:
        return [
            (Backend(w.url, w.healthy, w.aliases, w.status, w.backend_id), w.observed_model)
            for w in self._workers.of_tier(tier)
        ]

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        """Make `url` a backend of `tier` for `aliases`; idempotent, replaces a stale one."""
        if not aliases:
            raise AdapterError("register: at least one alias is required")
        existing = self._workers.at(url)
        if existing is not None:
            if self._matches(existing, tier, aliases) and not self._removal_pending(existing):
                return
            self._remove(existing)
        self._post(url, aliases, TIER_LABEL, tier)

    def deregister(self, tier: str, url: str) -> None:
        """Remove `url` from the router and wait until it is gone; absent is fine."""
        existing = self._workers.at(url)
        if existing is None:
            return
        if existing.tier not in (tier, None):
            raise AdapterError(f"{url} is registered for tier {existing.tier!r}, not {tier!r}")
        self._remove(existing)

    def drain(self, tier: str, *, hold_s: float = 0.0) -> None:
        """Quiesce: park the tier's alias (503 from now on, or held up to `hold_s` for the serve
        this process routes next), then remove every backend of the tier and wait until it is
        gone; requests in flight go on over their connections."""
        workers = self._workers.of_tier(tier)
        aliases = next((w.aliases for w in workers if w.aliases), ())
        if aliases:
            self._park(tier, aliases[0], hold_s)
        for worker in workers:
            self._remove(worker)

    def in_flight(self, tier: str, url: str) -> int | None:
        """smg's `load` of the worker at `url` (None once it is removed)."""
        worker = self._workers.at(url)
        return None if worker is None else worker.load

    def errors(self, tier: str, url: str) -> int | None:
        """The failures smg's circuit breaker counted for the worker at `url`
        (`smg_worker_cb_outcomes_total{outcome="failure"}`); None without `metrics_url`."""
        if self.metrics_url is None:
            return None
        try:
            r = self._http.get(self.metrics_url)
        except httpx.HTTPError as exc:
            raise TransientError(f"smg metrics {self.metrics_url}: {exc}") from exc
        if r.status_code != 200:
            raise TransientError(f"smg metrics {self.metrics_url}: HTTP {r.status_code}")
        samples = metric_samples(r.text, "smg_worker_cb_outcomes_total", f"smg metrics {self.metrics_url}")

        def failed(labels: dict[str, str]) -> bool:
            return labels.get("outcome") == "failure" and norm(labels.get("worker", "")) == norm(url)

        return round(sum(v for labels, v in samples if failed(labels)))

    def _park(self, tier: str, alias: str, hold_s: float) -> None:
        """Register `alias` on a worker at the parking responder (best effort)."""
        if self._parking is None:
            self._parking = ParkingResponder()
        key = uuid.uuid4().hex
        if hold_s > 0:
            self._parking.hold(key, hold_s)
            self._holding[tier] = key
        url = f"{self._parking.url}/parked/{key}"
        try:
            self._post(url, (alias,), PARKED_LABEL, tier, PARK_SETTLE_S)
        except AdapterError as exc:  # refused, or not listed in time
            log.warning("router.smg.park_failed", tier=tier, error=str(exc))
            return
        parked = self._workers.at(url)
        if parked is not None:
            self._parked[tier] = parked.id
        log.info("router.smg.parked", tier=tier, alias=alias, url=url)

    def _unpark(self, tier: str, target: str) -> None:
        """Hand what the park holds over to `target`, then remove the tier's parked workers: a
        DELETE drains one, a second removes it at once."""
        key = self._holding.pop(tier, None)
        if key is not None and self._parking is not None:
            self._parking.hand_over(key, target)
        parked = [w for w in self._workers.listed() if w.parked == tier]
        for worker in parked:
            for _ in range(1 if worker.draining else 2):
                self._workers.call("DELETE", f"/workers/{worker.id}")
            log.info("router.smg.unparked", tier=tier, url=worker.url)
        self._parked.pop(tier, None)
        if parked:
            gone = {w.url for w in parked}
            try:
                self._wait(
                    lambda: not any(w.url in gone for w in self._workers.listed()),
                    APPEAR_TIMEOUT_S,
                    f"tier {tier}'s parked worker removed",
                )
            except TransientError as exc:
                log.warning("router.smg.unpark_slow", tier=tier, error=str(exc))

    def readmit(self, r: Readmission) -> None:
        tier, url, aliases, expected_model = r.tier, r.url, r.aliases, r.expected_model
        if not aliases:
            raise AdapterError("readmit: at least one alias is required")
        alias, target = aliases[0], norm(url)
        started = self._clock()
        end = started + r.deadline_s
        since = started if r.hold else None
        stale = {"flag": False}

        def attempt() -> RoutedAnswer:
            # The tier has one backend: anything else registered for it goes first.
            for worker in self._workers.of_tier(tier):
                if worker.url != target:
                    self._remove(worker)
            existing = self._workers.at(url)
            if existing is not None and (
                stale["flag"] or not self._matches(existing, tier, aliases) or self._removal_pending(existing)
            ):
                self._remove(existing)
                existing = None
            stale["flag"] = False
            if existing is None:
                self._post(url, aliases, TIER_LABEL, tier)  # registrations are lost when smg restarts
                existing = self._workers.at(url)
            if existing is None or not existing.healthy:
                raise NotYetRouted(f"smg worker {url} not healthy yet")
            self._unpark(tier, target)  # the serve's worker is healthy: the alias goes to it alone
            answer = routed_chat(self._http, self.url, alias, self._client)
            # A 5xx from a healthy worker: smg's circuit breaker is open; a fresh registration
            # starts with a closed one.
            stale["flag"] = answer.status >= 500
            check_answer(answer, alias, expected_model)
            return self._hold(tier, target, alias, expected_model, since=since, end=end) or answer

        what = f"smg tier {tier} -> {url}"
        readmit_loop(attempt, what=what, deadline_s=r.deadline_s, sleep=self._sleep, clock=self._clock)
        seconds = round(self._clock() - started, 3)
        log.info(
            "router.smg.readmitted",
            tier=tier,
            url=target,
            model=expected_model,
            asked_to_hold=r.hold,
            seconds=seconds,
        )

    def _hold(
        self, tier: str, url: str, alias: str, expected_model: str, *, since: float | None, end: float
    ) -> RoutedAnswer | None:
        """Keep observing the registration until no removal can still land on it; gone or pending
        meanwhile: NotYetRouted. The routed chat is repeated at the end (None: nothing to wait for)."""
        until = self._hold_until(url, since)  # fixed: a removal noted meanwhile ends the hold below
        if until is None or self._clock() >= until:
            return None
        log.info("router.smg.hold", tier=tier, url=url, seconds=round(until - self._clock(), 3))
        while self._clock() < until:
            if self._clock() >= end:
                raise NotYetRouted(f"smg worker {url} not yet held for {self._hold_s:.1f} s")
            self._sleep(POLL_S)
            worker = self._workers.at(url)
            if worker is None:
                log.warning("router.smg.late_removal", tier=tier, url=url)
                raise NotYetRouted(f"smg removed {url} after it was registered (a late removal)")
            if self._removal_pending(worker):
                raise NotYetRouted(f"a removal of {url} is pending in smg")
        answer = routed_chat(self._http, self.url, alias, self._client)
        check_answer(answer, alias, expected_model)
        return answer

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        return super().check_route(tier, norm(url), expected_model)

    def routed_chat(self, alias: str) -> RoutedAnswer:
        """A chat to an alias that smg lists only on parked workers answers 503 without being sent:
        smg would retry the parking responder's 503 with backoff before it answered."""
        listing = [w for w in self._workers.listed() if w.aliases[:1] == (alias,)]
        if listing and all(w.parked for w in listing):
            return RoutedAnswer(status=503, model=None)
        return super().routed_chat(alias)

    def _route_problem(self, tier: str, url: str) -> tuple[str, str]:
        workers = self._workers.of_tier(tier)
        mine = [w for w in workers if w.url == url]
        others = sorted(w.url for w in workers if w not in mine)
        if not mine:
            return f"smg lists no worker of tier {tier!r} at {url}", ""
        if others:
            return f"tier {tier!r} also has {', '.join(others)}", ""
        if self._removal_pending(mine[0]):
            return f"smg has a removal of {url} pending (it is draining)", ""
        if not mine[0].healthy:
            return f"smg reads {url} unhealthy", ""
        return "", mine[0].aliases[0] if mine[0].aliases else ""
