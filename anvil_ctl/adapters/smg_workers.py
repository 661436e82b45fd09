"""smg's control plane (`/workers`), typed: the admin calls, and each listed worker narrowed to
the fields the router adapter reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.adapters.router_http import bearer, reject_auth, translated
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue

TIER_LABEL = "anvil.tier"
PARKED_LABEL = "anvil.parked"
"""On the worker that answers a drained tier's aliases with 503 (`anvil_ctl.adapters.smg_parking`)."""
DEFAULT_SETTLE_S = 5.0
"""smg's drain before it removes a DELETEd worker, unless the worker was registered with its own."""
NIL_WORKER_ID = "00000000-0000-0000-0000-000000000000"
PENDING_JOB = ("pending", "processing")


def norm(url: str) -> str:
    return url.rstrip("/")


@dataclass(frozen=True)
class SmgWorker:
    """One worker as `GET /workers` lists it (only the fields this adapter reads)."""

    id: str
    """The worker id as text ("None" when smg gave none), for `/workers/{id}`."""
    backend_id: str | None
    url: str
    status: str
    """smg's status ("draining" while a removal drains it); "unknown" when absent."""
    healthy: bool
    tier: str | None
    aliases: tuple[str, ...]
    """The ids of `models`, else `model_id`."""
    observed_model: JSONValue
    """The `served_model_name` label, as smg gave it."""
    load: int = 0
    """smg's count of requests it is passing to the worker now."""
    parked: str | None = None
    """The tier whose aliases this worker answers with 503 (`PARKED_LABEL`), if it is one."""
    settle_s: float = DEFAULT_SETTLE_S
    """How long smg drains the worker after a DELETE before it removes it."""

    @property
    def draining(self) -> bool:
        return self.status == "draining"

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> SmgWorker:
        labels = raw.get("labels") or {}
        tier = labels.get(TIER_LABEL) if isinstance(labels, dict) else None
        models = raw.get("models") or []
        ids = [m.get("id") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
        aliases = tuple(i for i in ids if isinstance(i, str)) or (
            (str(raw["model_id"]),) if raw.get("model_id") else ()
        )
        observed: JSONValue = labels.get("served_model_name") if isinstance(labels, dict) else None
        parked = labels.get(PARKED_LABEL) if isinstance(labels, dict) else None
        health = raw.get("health")
        settle = health.get("drain_settle_secs") if isinstance(health, dict) else None
        return cls(
            id=str(raw.get("id")),
            backend_id=str(raw.get("id")) if raw.get("id") else None,
            url=norm(str(raw.get("url"))),
            status=str(raw.get("status", "unknown")),
            healthy=bool(raw.get("is_healthy")),
            tier=tier if isinstance(tier, str) else None,
            aliases=aliases,
            observed_model=observed,
            load=load if isinstance(load := raw.get("load"), int) else 0,
            parked=parked if isinstance(parked, str) else None,
            settle_s=float(settle) if isinstance(settle, int | float) else DEFAULT_SETTLE_S,
        )


class SmgWorkers:
    def __init__(self, http: httpx.Client, admin_url: str, admin: Secret) -> None:
        self._http = http
        self._admin_url = admin_url
        self._admin = admin

    def call(self, method: str, path: str, json: JSONObject | None = None) -> httpx.Response:
        with translated(f"smg {method} {path}"):
            response = self._http.request(
                method, f"{self._admin_url}{path}", headers=bearer(self._admin), json=json
            )
        reject_auth(response, self._admin, f"{method} {path}")
        if response.status_code >= 500:
            raise TransientError(
                f"smg {method} {path} answered {response.status_code}", status=response.status_code
            )
        return response

    def listed(self) -> list[SmgWorker]:
        response = self.call("GET", "/workers")
        if response.status_code != 200:
            raise AdapterError(f"smg GET /workers answered {response.status_code}")
        try:
            workers = response.json()["workers"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AdapterError("smg GET /workers: unexpected body") from exc
        if not isinstance(workers, list):
            return []
        return [SmgWorker.from_json(w) for w in workers if isinstance(w, dict)]

    def at(self, url: str) -> SmgWorker | None:
        return next((w for w in self.listed() if w.url == norm(url)), None)

    def of_tier(self, tier: str) -> list[SmgWorker]:
        return [w for w in self.listed() if w.tier == tier]

    def removal_queued(self, worker: SmgWorker) -> bool:
        """smg reports a RemoveWorker job pending for the worker's URL (`GET /workers/{id}`)."""
        response = self.call("GET", f"/workers/{worker.id}")
        if response.status_code != 200:
            return False
        try:
            body = response.json()
        except ValueError:
            return False
        job = body.get("job_status") if isinstance(body, dict) else None
        return (
            isinstance(job, dict)
            and job.get("job_type") == "RemoveWorker"
            and job.get("status") in PENDING_JOB
        )
