"""The smg adapter against an in-memory smg (httpx.MockTransport) that keeps smg's quirks:
asynchronous registration, slow removal with a 409 for a pending URL, an open circuit
breaker on a healthy worker, and role-based 401/403."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.smg import NIL_WORKER_ID, TIER_LABEL, SmgRouter
from anvil_ctl.core.errors import AuthRejected, StepFailed, TransientError
from anvil_ctl.core.ports import Router

ADMIN, USER, CLIENT = "admin-key-123", "user-key-123", "client-key-123"
BACKEND = "http://127.0.0.1:8001"


@dataclass
class FakeWorker:
    id: str
    url: str
    models: list[str]
    labels: dict[str, str]
    healthy: bool = True
    breaker_open: bool = False
    removing_in: int | None = None  # GETs until a pending removal completes
    served: str = "stub-model-a"


@dataclass
class FakeSmg:
    workers: list[FakeWorker] = field(default_factory=list)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    removal_gets: int = 2
    calls: list[tuple[str, str]] = field(default_factory=list)
    down: bool = False

    def _id(self) -> str:
        return f"00000000-0000-0000-0000-{next(self.ids):012d}"

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path, method = request.url.path, request.method
        self.calls.append((method, path))
        auth = request.headers.get("authorization", "")
        if path == "/readiness":
            ok = any(w.healthy for w in self.workers)
            return httpx.Response(200 if ok else 503)
        if path.startswith("/workers"):
            if auth not in (f"Bearer {ADMIN}", f"Bearer {USER}"):
                return httpx.Response(401, text="Invalid authentication token")
            if method != "GET" and auth != f"Bearer {ADMIN}":
                return httpx.Response(403, text="Admin role required")
            return self._workers(request, method, path)
        if path == "/v1/chat/completions":
            if auth != f"Bearer {CLIENT}":
                return httpx.Response(401, json={"error": {"code": "invalid_api_key"}})
            model = json.loads(request.content)["model"]
            for w in self.workers:
                if model in w.models and w.removing_in is None:
                    if not w.healthy or w.breaker_open:
                        return httpx.Response(503, json={"error": "unavailable"})
                    return httpx.Response(
                        200,
                        json={
                            "model": w.served,
                            "choices": [{"message": {"content": "anvil-readmit"}}],
                        },
                    )
            return httpx.Response(404, json={"error": {"code": "model_not_found"}})
        return httpx.Response(404)

    def _workers(self, request: httpx.Request, method: str, path: str) -> httpx.Response:
        if method == "GET" and path == "/workers":
            for w in list(self.workers):
                if w.removing_in is not None:
                    w.removing_in -= 1
                    if w.removing_in < 0:
                        self.workers.remove(w)
            return httpx.Response(
                200,
                json={
                    "workers": [
                        {
                            "id": w.id,
                            "url": w.url,
                            "models": [{"id": m} for m in w.models[:1]],
                            "labels": {"served_model_name": w.served, **w.labels},
                            "is_healthy": w.healthy,
                            "status": "draining" if w.removing_in is not None else "ready",
                        }
                        for w in self.workers
                    ]
                },
            )
        if method == "POST" and path == "/workers":
            body = json.loads(request.content)
            for w in self.workers:
                if w.url == body["url"]:
                    return httpx.Response(409, json={"code": "WORKER_ALREADY_EXISTS"})
            worker = FakeWorker(
                self._id(), body["url"], [m["id"] for m in body["models"]], body.get("labels", {})
            )
            self.workers.append(worker)
            return httpx.Response(202, json={"status": "accepted", "worker_id": worker.id})
        if method == "DELETE":
            worker_id = path.rsplit("/", 1)[1]
            for w in self.workers:
                if w.id == worker_id:
                    w.removing_in = self.removal_gets
                    return httpx.Response(202, json={"status": "accepted"})
            return httpx.Response(404, json={"code": "WORKER_NOT_FOUND"})
        return httpx.Response(405)

    def add(self, url: str = BACKEND, tier: str = "primary-local", **kw: Any) -> FakeWorker:
        worker = FakeWorker(self._id(), url, ["llm.primary"], {TIER_LABEL: tier}, **kw)
        self.workers.append(worker)
        return worker


@pytest.fixture
def smg() -> FakeSmg:
    return FakeSmg()


def make_router(smg: FakeSmg, admin: str = ADMIN, client: str = CLIENT) -> SmgRouter:
    creds = RouterCredentials(
        client=Secret(client, "env ANVIL_ROUTER_CLIENT_TOKEN"),
        admin=Secret(admin, "env ANVIL_ROUTER_ADMIN_TOKEN"),
    )
    return SmgRouter(
        "http://127.0.0.1:30000",
        creds,
        transport=httpx.MockTransport(smg.handler),
        poll_s=0.0,
        sleep=lambda _s: None,
    )


class TestSmgRouterCredentials:
    def test_it_implements_the_router_port(self, smg):
        assert isinstance(make_router(smg), Router)

    def test_probe_passes_with_admin_and_client_keys_and_touches_no_worker(self, smg):
        worker = smg.add()
        make_router(smg).probe_credentials()
        assert ("DELETE", f"/workers/{NIL_WORKER_ID}") in smg.calls
        assert worker.removing_in is None

    def test_a_user_role_admin_key_is_auth_rejected_naming_the_source(self, smg):
        with pytest.raises(AuthRejected) as err:
            make_router(smg, admin=USER).probe_credentials()
        assert err.value.data["status"] == 403
        assert "env ANVIL_ROUTER_ADMIN_TOKEN" in str(err.value)
        assert USER not in str(err.value)

    def test_a_wrong_admin_key_is_auth_rejected_with_401(self, smg):
        with pytest.raises(AuthRejected) as err:
            make_router(smg, admin="wrong-key-1").probe_credentials()
        assert err.value.data["status"] == 401

    def test_a_wrong_client_key_is_auth_rejected_naming_the_client_source(self, smg):
        with pytest.raises(AuthRejected) as err:
            make_router(smg, client="wrong-key-1").probe_credentials()
        assert "env ANVIL_ROUTER_CLIENT_TOKEN" in str(err.value)
        assert "wrong-key-1" not in str(err.value)

    def test_readmit_with_a_rejected_client_key_fails_at_once_without_retrying(self, smg):
        smg.add()
        with pytest.raises(AuthRejected):
            make_router(smg, client="wrong-key-1").readmit(
                "primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30
            )
        assert smg.calls.count(("POST", "/v1/chat/completions")) == 1


class TestSmgRouterRegistration:
    def test_register_posts_the_alias_and_tier_label_and_waits_until_listed(self, smg):
        router = make_router(smg)
        router.register("primary-local", BACKEND + "/", ("llm.primary",))
        (backend,) = router.backends("primary-local")
        assert backend.url == BACKEND
        assert backend.models == ("llm.primary",)
        assert router.backends("other-tier") == []

    def test_register_of_a_matching_worker_is_a_no_op(self, smg):
        smg.add()
        make_router(smg).register("primary-local", BACKEND, ("llm.primary",))
        assert ("POST", "/workers") not in smg.calls

    def test_register_waits_for_a_pending_removal_before_posting(self, smg):
        old = smg.add(tier="old-tier")
        smg.removal_gets = 3
        make_router(smg).register("primary-local", BACKEND, ("llm.primary",))
        assert old not in smg.workers
        (new,) = smg.workers
        assert new.id != old.id
        assert new.labels[TIER_LABEL] == "primary-local"

    def test_deregister_waits_until_the_url_is_gone(self, smg):
        smg.add()
        make_router(smg).deregister("primary-local", BACKEND)
        assert smg.workers == []

    def test_deregister_of_an_absent_url_is_a_no_op(self, smg):
        make_router(smg).deregister("primary-local", BACKEND)
        assert ("DELETE", "/workers") not in [(m, p[:8]) for m, p in smg.calls]

    def test_drain_removes_only_the_tier_backends(self, smg):
        smg.add()
        other = smg.add(url="http://127.0.0.1:8002", tier="secondary")
        make_router(smg).drain("primary-local")
        assert smg.workers == [other]

    def test_a_removal_that_never_finishes_is_transient(self, smg):
        smg.add()
        smg.removal_gets = 10**9
        router = make_router(smg)
        router._removal_timeout_s = 0.05
        with pytest.raises(TransientError, match="removed"):
            router.deregister("primary-local", BACKEND)


class TestSmgRouterReadmit:
    def test_readmit_registers_and_ends_with_a_verified_routed_chat(self, smg):
        router = make_router(smg)
        router.readmit("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5)
        assert smg.calls[-1] == ("POST", "/v1/chat/completions")
        assert router.routed_chat("llm.primary").model == "stub-model-a"

    def test_readmit_reregisters_a_healthy_worker_whose_breaker_is_open(self, smg):
        stuck = smg.add(breaker_open=True)
        router = make_router(smg)
        assert router.ready()
        assert router.routed_chat("llm.primary").status == 503
        router.readmit("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=10)
        assert stuck not in smg.workers
        assert router.routed_chat("llm.primary").status == 200

    def test_readmit_after_a_router_restart_registers_again(self, smg):
        smg.add()
        smg.workers.clear()  # a restarted smg remembers nothing
        make_router(smg).readmit("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5)
        assert [w.url for w in smg.workers] == [BACKEND]

    def test_readmit_removes_another_backend_of_the_tier(self, smg):
        smg.add(url="http://127.0.0.1:8009", served="candidate")
        make_router(smg).readmit("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5)
        assert [w.url for w in smg.workers] == [BACKEND]

    def test_readmit_fails_at_the_deadline_when_the_wrong_model_answers(self, smg):
        smg.add(served="some-other-model")
        with pytest.raises(StepFailed) as err:
            make_router(smg).readmit(
                "primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=0.3
            )
        assert "some-other-model" in str(err.value)

    def test_readmit_retries_while_the_router_is_unreachable(self, smg):
        router = make_router(smg)
        smg.down = True
        with pytest.raises(StepFailed, match="ConnectError"):
            router.readmit("primary-local", BACKEND, ("llm.primary",), "m", deadline_s=0.3)

    def test_ready_is_false_when_the_router_is_down(self, smg):
        smg.down = True
        assert make_router(smg).ready() is False


class TestSmgRouterView:
    def test_view_reports_backend_observed_model_and_readiness_without_secrets(self, smg):
        smg.add()
        view = make_router(smg).view("primary-local")
        assert view == {
            "router": "smg",
            "tier": "primary-local",
            "ready": True,
            "backends": [
                {
                    "url": BACKEND,
                    "aliases": ["llm.primary"],
                    "observed_model": "stub-model-a",
                    "healthy": True,
                    "state": "ready",
                }
            ],
        }
        text = json.dumps(view)
        assert ADMIN not in text
        assert CLIENT not in text
