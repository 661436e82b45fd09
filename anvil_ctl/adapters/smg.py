"""Router adapter for the SGLang/Shepherd Model Gateway (`smg`, pinned 1.13.0) `/workers` API.

Admin calls (`/workers`) carry the control-plane key (admin role); routed
calls carry the data-plane key. A tier is the label `anvil.tier` on smg's
workers; a tier has one backend, registered with its first alias as model id
(smg 1.13 keeps only the first entry of `models`; extra aliases need
`--model-alias` when smg starts).

Observed behaviour this adapter is written around (smg 1.13.0):
- `POST /workers` answers 202 and registers in the background; the worker
  appears in `GET /workers` about a second later.
- `DELETE /workers/{id}` answers 202, marks the worker `draining` (no new
  requests) and removes it about 5 s later. A POST of the same URL meanwhile
  is refused (409) or answered with the old id, which then vanishes; so every
  removal waits until the URL is gone before anything is posted again.
- After a backend restart `/readiness` answers 200 and the worker reads
  healthy while routed chat can answer 503 for up to a minute (an open
  circuit breaker). Readiness proves nothing: readmission ends only with an
  authenticated routed chat answering 200 from the expected served model, and
  re-registers the worker (a fresh worker has a closed breaker) when a healthy
  worker's chat fails.
- Registrations live in memory: a restarted smg has none, so readmission
  re-registers whatever is missing.
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
    bearer,
    check_answer,
    probe_client_token,
    readmit_loop,
    reject_auth,
    routed_chat,
    translated,
)
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.model import Backend, RoutedAnswer

log = structlog.get_logger()

TIER_LABEL = "anvil.tier"
NIL_WORKER_ID = "00000000-0000-0000-0000-000000000000"


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
        poll_s: float = 0.25,
        removal_timeout_s: float = 30.0,
        appear_timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = _norm(url)
        self.admin_url = _norm(admin_url or url)
        self._admin: Secret = credentials.require_admin()
        self._client: Secret = credentials.client
        self._http = httpx.Client(transport=transport, timeout=timeout_s)
        self._poll_s = poll_s
        self._removal_timeout_s = removal_timeout_s
        self._appear_timeout_s = appear_timeout_s
        self._sleep = sleep

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

    def _remove(self, worker: dict[str, Any]) -> None:
        """DELETE a worker and wait until its URL is gone (see the delete/post race above)."""
        worker_id, url = str(worker.get("id")), str(worker.get("url"))
        response = self._call("DELETE", f"/workers/{worker_id}")
        if response.status_code not in (200, 202, 204, 404):
            raise AdapterError(
                f"smg DELETE /workers/{worker_id} answered {response.status_code}",
                status=response.status_code,
            )
        log.info("router.smg.remove", url=url, worker_id=worker_id)
        self._wait(lambda: self._worker_at(url) is None, self._removal_timeout_s, f"{url} removed")

    def _wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() >= end:
                raise TransientError(f"smg: timed out after {timeout_s:.0f} s waiting for {what}")
            self._sleep(self._poll_s)

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
            if self._matches(existing, tier, aliases):
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
        self, tier: str, url: str, aliases: tuple[str, ...], expected_model: str, deadline_s: float
    ) -> None:
        if not aliases:
            raise AdapterError("readmit: at least one alias is required")
        alias = aliases[0]
        stale = {"flag": False}

        def attempt() -> RoutedAnswer:
            # The tier has one backend: anything else registered for it goes first.
            for worker in self._tier_workers(tier):
                if _norm(str(worker.get("url"))) != _norm(url):
                    self._remove(worker)
            existing = self._worker_at(url)
            if existing is not None and (stale["flag"] or not self._matches(existing, tier, aliases)):
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
            return answer

        readmit_loop(attempt, what=f"smg tier {tier} -> {url}", deadline_s=deadline_s, sleep=self._sleep)
        log.info("router.smg.readmitted", tier=tier, url=_norm(url), model=expected_model)

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
