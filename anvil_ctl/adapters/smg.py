"""Router adapter for the SGLang/Shepherd Model Gateway (`smg`, pinned 1.13.0) `/workers` API.

Admin calls (`/workers`) carry the control-plane key (admin role); routed
calls carry the data-plane key. A tier is the label `anvil.tier` on smg's
workers; a tier has one backend, registered with its first alias as model id
(smg 1.13 keeps only the first entry of `models`; extra aliases need
`--model-alias` when smg starts).

Observed behaviour this adapter is written around (smg 1.13.0, against the real
binary in the test environment):
- `POST /workers` answers 202 and registers in the background (a job); the
  worker appears in `GET /workers` 0.1-0.3 s later.
- `DELETE /workers/{id}` answers 202 and queues a removal job keyed by the
  worker's URL: the worker reads `draining` (unhealthy, routed chat 503) at once,
  `GET /workers/{id}` shows `job_status` {job_type RemoveWorker, status
  processing}, and after a fixed 5 s drain the job removes *whatever worker is
  registered at that URL by then* (gone 5.10-5.15 s after the DELETE). Nothing
  cancels it: a POST of the URL meanwhile answers 409, a PUT answers 202 and reads
  the worker `ready` again, yet the removal still lands. A second DELETE of a
  draining worker removes it at once and clears the URL's job status while the
  first removal is still pending, invisible, and takes the next registration of
  that URL with it. So: a worker whose removal is pending is never DELETEd again
  (the adapter waits until it is gone), and readmission holds (below).
- After a backend restart `/readiness` answers 200 and the worker reads
  healthy while routed chat can answer 503 for up to a minute (an open
  circuit breaker). Readiness proves nothing: readmission ends only with an
  authenticated routed chat answering 200 from the expected served model, and
  re-registers the worker (a fresh worker has a closed breaker) when a healthy
  worker's chat fails.
- Registrations live in memory: a restarted smg has none, so readmission
  re-registers whatever is missing.

The hold: a registration made while a removal of its URL may still be pending is
kept under observation until that removal has surely landed, and registered again
if it lands meanwhile. A removal may be pending, and readmission holds, only when
- this adapter sent a DELETE for the URL whose removal it has not seen land after a
  full drain (`OWN_REMOVAL_MIN_S`): a removal seen sooner was a second DELETE's,
  and the first one's may still be queued, invisible;
- a removal was seen pending for the URL (a draining worker, a queued RemoveWorker
  job), at readmission start or during it (someone else's DELETE): held until
  `removal_hold_s` after its sighting;
- the caller asks (`hold=True`): it cannot know what a process that died before it
  sent (`recover`), or it repairs a route something broke (`reconcile`, the
  availability restore, a goal's repair): held until `removal_hold_s` after the
  readmission began.
A live transaction's own drain waited until its removal landed, so its readmission
ends at the first verified routed chat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.router_http import (
    NotYetRouted,
    answer_problem,
    bearer,
    check_answer,
    probe_client_token,
    readmit_loop,
    reject_auth,
    routed_chat,
    translated,
)
from anvil_ctl.adapters.tls import context_for
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.model import Backend, RouteCheck, RoutedAnswer

log = structlog.get_logger()

TIER_LABEL = "anvil.tier"
NIL_WORKER_ID = "00000000-0000-0000-0000-000000000000"
PENDING_JOB = ("pending", "processing")
OWN_REMOVAL_MIN_S = 5.0
"""smg 1.13 removes a DELETEd worker after a fixed 5 s drain (5.10-5.15 s measured): a
removal this adapter sees land sooner than this after its DELETE was not (only) its own.
(A foreign second DELETE landing in the last ~0.1 s before ours cannot be told apart; the
engine's goal check after readmission finds the route gone and repairs it, holding.)"""
POLL_FIRST_S = 0.02
"""Polls start this short and double up to `poll_s`: most waits end within a few polls."""


def _norm(url: str) -> str:
    return url.rstrip("/")


class SmgRouter:
    """`anvil_ctl.core.ports.Router` over smg's HTTP control and data planes."""

    def __init__(
        self,
        url: str,
        credentials: RouterCredentials,
        *,
        admin_url: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
        poll_s: float = 0.1,
        removal_timeout_s: float = 30.0,
        appear_timeout_s: float = 10.0,
        removal_hold_s: float = 6.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = _norm(url)
        self.admin_url = _norm(admin_url or url)
        self._admin: Secret = credentials.require_admin()
        self._client: Secret = credentials.client
        self._http = httpx.Client(
            transport=transport, timeout=timeout_s, verify=context_for(self.url, self.admin_url)
        )
        self._poll_s = poll_s
        self._removal_timeout_s = removal_timeout_s
        self._appear_timeout_s = appear_timeout_s
        self._hold_s = removal_hold_s
        self._sleep = sleep
        self._clock = clock
        self._removals_seen: dict[str, tuple[str, float]] = {}
        """URL -> (worker id, first sighting) of the newest removal seen pending there."""
        self._deletes_unlanded: dict[str, float] = {}
        """URL -> when this adapter sent a DELETE there whose removal it has not seen land."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SmgRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SmgRouter(url={self.url!r}, admin_url={self.admin_url!r})"

    # -- control plane ------------------------------------------------------

    def _call(self, method: str, path: str, json: Any = None) -> httpx.Response:
        with translated(f"smg {method} {path}"):
            response = self._http.request(
                method, f"{self.admin_url}{path}", headers=bearer(self._admin), json=json
            )
        reject_auth(response, self._admin, f"{method} {path}")
        if response.status_code >= 500:
            raise TransientError(
                f"smg {method} {path} answered {response.status_code}", status=response.status_code
            )
        return response

    def _workers(self) -> list[dict[str, Any]]:
        response = self._call("GET", "/workers")
        if response.status_code != 200:
            raise AdapterError(f"smg GET /workers answered {response.status_code}")
        try:
            workers = response.json()["workers"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AdapterError("smg GET /workers: unexpected body") from exc
        return [w for w in workers if isinstance(w, dict)]

    def _worker_at(self, url: str) -> dict[str, Any] | None:
        target = _norm(url)
        for worker in self._workers():
            if _norm(str(worker.get("url", ""))) == target:
                return worker
        return None

    @staticmethod
    def _tier_of(worker: dict[str, Any]) -> str | None:
        labels = worker.get("labels") or {}
        tier = labels.get(TIER_LABEL) if isinstance(labels, dict) else None
        return tier if isinstance(tier, str) else None

    @staticmethod
    def _aliases_of(worker: dict[str, Any]) -> tuple[str, ...]:
        models = worker.get("models") or []
        ids = [m.get("id") for m in models if isinstance(m, dict)]
        return tuple(i for i in ids if isinstance(i, str)) or (
            (str(worker["model_id"]),) if worker.get("model_id") else ()
        )

    def _tier_workers(self, tier: str) -> list[dict[str, Any]]:
        return [w for w in self._workers() if self._tier_of(w) == tier]

    def _job_status(self, worker: dict[str, Any]) -> dict[str, Any] | None:
        """The job smg reports for the worker's URL (`GET /workers/{id}`), if any."""
        response = self._call("GET", f"/workers/{worker.get('id')}")
        if response.status_code != 200:
            return None
        try:
            job = response.json().get("job_status")
        except (ValueError, AttributeError):
            return None
        return job if isinstance(job, dict) else None

    def _removal_pending(self, worker: dict[str, Any]) -> bool:
        """smg will remove this worker's URL: it drains, or a RemoveWorker job is queued for it.

        Seen pending, it is remembered (`_removals_seen`): readmission holds past it.
        """
        pending = worker.get("status") == "draining"
        if not pending:
            job = self._job_status(worker) or {}
            pending = job.get("job_type") == "RemoveWorker" and job.get("status") in PENDING_JOB
        if pending:
            url, worker_id, now = _norm(str(worker.get("url"))), str(worker.get("id")), self._clock()
            seen = self._removals_seen.get(url)
            if seen is None or seen[0] != worker_id or now >= seen[1] + self._hold_s:
                self._removals_seen[url] = (worker_id, now)
                log.info("router.smg.removal_pending", url=url, worker_id=worker_id)
        return pending

    def _remove(self, worker: dict[str, Any]) -> None:
        """Remove a worker and wait until its URL is gone (see the removal notes above).

        A worker whose removal is already pending is not DELETEd again: that would
        remove it at once and hide the pending removal, which then takes the next
        registration of the URL. Our own DELETE counts as landed only when the URL went
        after a full drain (`OWN_REMOVAL_MIN_S`); until then readmission holds.
        """
        worker_id, url = str(worker.get("id")), _norm(str(worker.get("url")))
        sent: float | None = None
        if not self._removal_pending(worker):
            sent = self._deletes_unlanded[url] = self._clock()
            response = self._call("DELETE", f"/workers/{worker_id}")
            if response.status_code not in (200, 202, 204, 404):
                raise AdapterError(
                    f"smg DELETE /workers/{worker_id} answered {response.status_code}",
                    status=response.status_code,
                )
            log.info("router.smg.remove", url=url, worker_id=worker_id)
        self._wait(lambda: self._worker_at(url) is None, self._removal_timeout_s, f"{url} removed")
        if sent is not None and self._clock() - sent >= OWN_REMOVAL_MIN_S:
            if self._deletes_unlanded.get(url) == sent:
                del self._deletes_unlanded[url]
        elif sent is not None:
            log.warning("router.smg.early_removal", url=url, seconds=round(self._clock() - sent, 3))

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = self._clock() + timeout_s
        pause = min(POLL_FIRST_S, self._poll_s)
        while not done():
            if self._clock() >= end:
                raise TransientError(f"smg: timed out after {timeout_s:.0f} s waiting for {what}")
            self._sleep(pause)
            pause = min(pause * 2, self._poll_s)

    def _post(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        body = {
            "url": _norm(url),
            "models": [{"id": alias} for alias in aliases],
            "labels": {TIER_LABEL: tier},
        }
        response = self._call("POST", "/workers", json=body)
        if response.status_code == 409:
            # A removal of the same URL still pending: wait for it, then post again.
            raise TransientError(f"smg POST /workers {url}: a worker for this URL is still listed")
        if response.status_code not in (200, 201, 202):
            raise AdapterError(
                f"smg POST /workers {url} answered {response.status_code}: {response.text[:200]}",
                status=response.status_code,
            )
        log.info("router.smg.register", tier=tier, url=_norm(url), aliases=list(aliases))
        self._wait(lambda: self._worker_at(url) is not None, self._appear_timeout_s, f"{url} listed")

    def _matches(self, worker: dict[str, Any], tier: str, aliases: tuple[str, ...]) -> bool:
        return (
            self._tier_of(worker) == tier
            and self._aliases_of(worker)[:1] == aliases[:1]
            and worker.get("status") != "draining"
        )

    # -- Router port ----------------------------------------------------------

    def probe_credentials(self) -> None:
        """Admin: DELETE of the nil worker id (404 proves the admin role; nothing exists to delete).

        Client: a chat to an alias no tier serves (404 proves the key). A
        user-role admin key answers 403, a wrong one 401: both AuthRejected.
        """
        response = self._call("DELETE", f"/workers/{NIL_WORKER_ID}")
        if response.status_code not in (404, 200, 202):
            raise AdapterError(f"smg admin probe answered {response.status_code}")
        probe_client_token(self._http, self.url, self._client)

    def backends(self, tier: str) -> list[Backend]:
        return [
            Backend(
                url=_norm(str(w.get("url"))),
                healthy=bool(w.get("is_healthy")),
                models=self._aliases_of(w),
                state=str(w.get("status", "unknown")),
                backend_id=str(w.get("id")) if w.get("id") else None,
            )
            for w in self._tier_workers(tier)
        ]

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        """Make `url` a backend of `tier` for `aliases`; idempotent, replaces a stale one."""
        if not aliases:
            raise AdapterError("register: at least one alias is required")
        existing = self._worker_at(url)
        if existing is not None:
            if self._matches(existing, tier, aliases) and not self._removal_pending(existing):
                return
            self._remove(existing)
        self._post(tier, url, aliases)

    def deregister(self, tier: str, url: str) -> None:
        """Remove `url` from the router and wait until it is gone; absent is fine."""
        existing = self._worker_at(url)
        if existing is None:
            return
        if self._tier_of(existing) not in (tier, None):
            raise AdapterError(f"{url} is registered for tier {self._tier_of(existing)!r}, not {tier!r}")
        self._remove(existing)

    def drain(self, tier: str) -> None:
        """Quiesce: smg's removal stops new admissions at once (`draining`) and lets in-flight
        requests finish; wait until every backend of the tier is gone."""
        for worker in self._tier_workers(tier):
            self._remove(worker)

    def readmit(
        self,
        tier: str,
        url: str,
        aliases: tuple[str, ...],
        expected_model: str,
        deadline_s: float,
        *,
        hold: bool = False,
    ) -> None:
        if not aliases:
            raise AdapterError("readmit: at least one alias is required")
        alias, target = aliases[0], _norm(url)
        started = self._clock()
        end = started + deadline_s
        stale = {"flag": False}

        def attempt() -> RoutedAnswer:
            # The tier has one backend: anything else registered for it goes first.
            for worker in self._tier_workers(tier):
                if _norm(str(worker.get("url"))) != target:
                    self._remove(worker)
            existing = self._worker_at(url)
            if existing is not None and (
                stale["flag"] or not self._matches(existing, tier, aliases) or self._removal_pending(existing)
            ):
                self._remove(existing)
                existing = None
            stale["flag"] = False
            if existing is None:
                self._post(tier, url, aliases)  # registrations are lost when smg restarts
                existing = self._worker_at(url)
            if existing is None or not existing.get("is_healthy"):
                raise NotYetRouted(f"smg worker {url} not healthy yet")
            answer = routed_chat(self._http, self.url, alias, self._client)
            # Healthy worker, chat failing with a 5xx: smg's circuit breaker is open.
            # A fresh registration starts with a closed breaker.
            stale["flag"] = answer.status >= 500
            check_answer(answer, alias, expected_model)
            return (
                self._hold(
                    tier,
                    target,
                    alias=alias,
                    expected_model=expected_model,
                    since=started if hold else None,
                    end=end,
                )
                or answer
            )

        readmit_loop(
            attempt,
            what=f"smg tier {tier} -> {url}",
            deadline_s=deadline_s,
            sleep=self._sleep,
            clock=self._clock,
        )
        log.info(
            "router.smg.readmitted",
            tier=tier,
            url=target,
            model=expected_model,
            asked_to_hold=hold,
            seconds=round(self._clock() - started, 3),
        )

    def _hold_until(self, url: str, since: float | None) -> float | None:
        """When every removal that may still be pending for `url` has surely landed (None: none may).

        `since`: the caller's own reason to hold (the readmission's start), else None.
        """
        seen = self._removals_seen.get(url)
        sent = self._deletes_unlanded.get(url)
        reasons = [t for t in (since, seen[1] if seen else None, sent) if t is not None]
        return max(reasons) + self._hold_s if reasons else None

    def _held(self, url: str, since: float | None) -> bool:
        until = self._hold_until(url, since)
        return until is None or self._clock() >= until

    def _hold(
        self,
        tier: str,
        url: str,
        *,
        alias: str,
        expected_model: str,
        since: float | None,
        end: float,
    ) -> RoutedAnswer | None:
        """Keep observing the registration until no removal can still land on it.

        A removal sent before `since` lands within smg's drain (5 s) of it, one seen
        pending within the drain of its sighting, our own DELETE within the drain of its
        sending; past `removal_hold_s` after each, nothing queued can remove the URL.
        Gone or pending removal meanwhile: NotYetRouted, and the next attempt registers
        again. The routed chat is repeated at the end (None when there was nothing to
        wait for).
        """
        if self._held(url, since):
            return None
        until = self._hold_until(url, since) or self._clock()
        log.info("router.smg.hold", tier=tier, url=url, seconds=round(until - self._clock(), 3))
        while not self._held(url, since):
            if self._clock() >= end:
                raise NotYetRouted(f"smg worker {url} not yet held for {self._hold_s:.1f} s")
            self._sleep(self._poll_s)
            worker = self._worker_at(url)
            if worker is None:
                log.warning("router.smg.late_removal", tier=tier, url=url)
                raise NotYetRouted(f"smg removed {url} after it was registered (a late removal)")
            if self._removal_pending(worker):
                raise NotYetRouted(f"a removal of {url} is pending in smg")
        answer = routed_chat(self._http, self.url, alias, self._client)
        check_answer(answer, alias, expected_model)
        return answer

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        target = _norm(url)

        def verdict(reason: str = "") -> RouteCheck:
            return RouteCheck(tier, target, expected_model, holds=not reason, reason=reason)

        try:
            workers = self._tier_workers(tier)
            mine = [w for w in workers if _norm(str(w.get("url"))) == target]
            others = sorted(_norm(str(w.get("url"))) for w in workers if w not in mine)
            if not mine:
                return verdict(f"smg lists no worker of tier {tier!r} at {target}")
            if others:
                return verdict(f"tier {tier!r} also has {', '.join(others)}")
            if self._removal_pending(mine[0]):
                return verdict(f"smg has a removal of {target} pending (it is draining)")
            if not mine[0].get("is_healthy"):
                return verdict(f"smg reads {target} unhealthy")
            alias = self._aliases_of(mine[0])[0] if self._aliases_of(mine[0]) else ""
            answer = routed_chat(self._http, self.url, alias, self._client)
        except AdapterError as exc:  # unreachable, busy or answering nonsense: no route to rely on
            return verdict(f"smg: {exc}")
        return verdict(answer_problem(answer, alias, expected_model) or "")

    def routed_chat(self, alias: str) -> RoutedAnswer:
        return routed_chat(self._http, self.url, alias, self._client)

    def ready(self) -> bool:
        try:
            with translated("smg GET /readiness"):
                response = self._http.get(f"{self.url}/readiness")
        except TransientError:
            return False
        return response.status_code == 200

    def view(self, tier: str) -> dict[str, Any]:
        """The router's view of a tier for snapshots: backends, observed model, readiness."""
        workers = self._tier_workers(tier)
        return {
            "router": "smg",
            "tier": tier,
            "ready": self.ready(),
            "backends": [
                {
                    "url": _norm(str(w.get("url"))),
                    "aliases": list(self._aliases_of(w)),
                    "observed_model": (w.get("labels") or {}).get("served_model_name"),
                    "healthy": bool(w.get("is_healthy")),
                    "state": str(w.get("status", "unknown")),
                }
                for w in sorted(workers, key=lambda w: str(w.get("url")))
            ],
        }
