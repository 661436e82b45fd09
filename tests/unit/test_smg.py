"""The smg adapter against an in-memory smg (httpx.MockTransport) that keeps smg 1.13's quirks:
asynchronous registration; removal by URL after a fixed drain, which nothing cancels and a
second DELETE hides; a 409 for a POST while the URL is listed; an open circuit breaker on a
healthy worker; role-based 401/403. Time is the fake's own clock, advanced by the router's
sleeps."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.smg import PARK_SETTLE_S, SmgRouter
from anvil_ctl.adapters.smg_parking import ParkingResponder
from anvil_ctl.adapters.smg_workers import NIL_WORKER_ID, PARKED_LABEL, TIER_LABEL
from anvil_ctl.core.errors import AuthRejected, StepFailed, TransientError
from anvil_ctl.core.model import Readmission, RoutedAnswer
from anvil_ctl.core.ports import Router
from tests.unit.loopback import loopback_server

ADMIN, USER, CLIENT = "admin-key-123", "user-key-123", "client-key-123"
BACKEND = "http://127.0.0.1:8001"
TIER, ALIAS, MODEL = "primary-local", "llm.primary", "stub-model-a"


@dataclass
class FakeWorker:
    id: str
    url: str
    models: list[str]
    labels: dict[str, str]
    healthy: bool = True
    breaker_open: bool = False
    draining: bool = False
    served: str = MODEL
    drain_s: float | None = None
    """The worker's own `health.drain_settle_secs` (None: smg's `FakeSmg.drain_s`)."""


@dataclass
class FakeSmg:
    workers: list[FakeWorker] = field(default_factory=list)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    drain_s: float = 5.0
    """smg 1.13 drains a removed worker this long, then removes whatever is at its URL."""
    now: float = 0.0
    removals: list[tuple[float, str]] = field(default_factory=list)
    """Queued removal jobs: (when they land, URL)."""
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)
    """smg's job status, by URL (what GET /workers/{id} shows as job_status)."""
    scheduled: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    down: bool = False

    # -- the fake's clock ---------------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.05)
        self._tick()

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run `action` once the fake clock reaches `when` (someone else acting on smg)."""
        self.scheduled.append((when, action))

    def _tick(self) -> None:
        for due in [a for a in self.scheduled if a[0] <= self.now]:
            self.scheduled.remove(due)
            due[1]()
        for due_removal in [r for r in self.removals if r[0] <= self.now]:
            self.removals.remove(due_removal)
            self._drop(due_removal[1])

    def _drop(self, url: str) -> None:
        self.workers = [w for w in self.workers if w.url != url]
        self.jobs.pop(url, None)

    # -- what another client (a killed process) did -------------------------------------------

    def delete(self, worker: FakeWorker) -> None:
        """smg's DELETE: start a drain, or remove at once a worker that already drains."""
        if worker.draining or worker.drain_s == 0:
            self._drop(worker.url)  # a pending removal stays queued, now invisible
            return
        worker.draining = True
        drain_s = self.drain_s if worker.drain_s is None else worker.drain_s
        self.removals.append((self.now + drain_s, worker.url))
        self.jobs[worker.url] = {"job_type": "RemoveWorker", "status": "processing"}

    def at_url(self, url: str = BACKEND) -> FakeWorker | None:
        return next((w for w in self.workers if w.url == url), None)

    # -- HTTP ---------------------------------------------------------------------------------

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self._tick()
        path, method = request.url.path, request.method
        self.calls.append((method, path))
        auth = request.headers.get("authorization", "")
        if path == "/readiness":
            ok = any(w.healthy and not w.draining for w in self.workers)
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
                if model in w.models[:1]:
                    if not w.healthy or w.breaker_open or w.draining:
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

    def _info(self, w: FakeWorker) -> dict[str, Any]:
        return {
            "id": w.id,
            "url": w.url,
            "models": [{"id": m} for m in w.models[:1]],
            "labels": {"served_model_name": w.served, **w.labels},
            "is_healthy": w.healthy and not w.draining,
            "status": "draining" if w.draining else "ready",
        }

    def _workers(self, request: httpx.Request, method: str, path: str) -> httpx.Response:
        if method == "GET" and path == "/workers":
            return httpx.Response(200, json={"workers": [self._info(w) for w in self.workers]})
        worker_id = path.rsplit("/", 1)[1]
        worker = next((w for w in self.workers if w.id == worker_id), None)
        if method == "GET":
            if worker is None:
                return httpx.Response(404, json={"code": "WORKER_NOT_FOUND"})
            return httpx.Response(200, json={**self._info(worker), "job_status": self.jobs.get(worker.url)})
        if method == "POST" and path == "/workers":
            body = json.loads(request.content)
            if self.at_url(body["url"]) is not None:
                return httpx.Response(409, json={"code": "WORKER_ALREADY_EXISTS"})
            worker = FakeWorker(
                self._id(),
                body["url"],
                [m["id"] for m in body["models"]],
                body.get("labels", {}),
                drain_s=body.get("health", {}).get("drain_settle_secs"),
            )
            self.workers.append(worker)
            self.jobs.pop(worker.url, None)  # the AddWorker job overwrites the URL's status, then ends
            return httpx.Response(202, json={"status": "accepted", "worker_id": worker.id})
        if method == "DELETE":
            if worker is None:
                return httpx.Response(404, json={"code": "WORKER_NOT_FOUND"})
            self.delete(worker)
            return httpx.Response(202, json={"status": "accepted"})
        return httpx.Response(405)

    def _id(self) -> str:
        return f"00000000-0000-0000-0000-{next(self.ids):012d}"

    def add(self, url: str = BACKEND, tier: str = TIER, **kw: Any) -> FakeWorker:
        worker = FakeWorker(self._id(), url, [ALIAS], {TIER_LABEL: tier}, **kw)
        self.workers.append(worker)
        return worker


@pytest.fixture
def smg() -> FakeSmg:
    return FakeSmg()


def make_router(smg: FakeSmg, admin: str = ADMIN, client: str = CLIENT, **kw: Any) -> SmgRouter:
    creds = RouterCredentials(
        client=Secret(client, "env ANVIL_ROUTER_CLIENT_TOKEN"),
        admin=Secret(admin, "env ANVIL_ROUTER_ADMIN_TOKEN"),
    )
    return SmgRouter(
        "http://127.0.0.1:30000",
        creds,
        transport=httpx.MockTransport(smg.handler),
        sleep=smg.sleep,
        clock=smg.clock,
        **kw,
    )


class TestSmgRouterCredentials:
    def test_it_implements_the_router_port(self, smg):
        assert isinstance(make_router(smg), Router)

    def test_probe_passes_with_admin_and_client_keys_and_touches_no_worker(self, smg):
        worker = smg.add()
        make_router(smg).probe_credentials()
        assert ("DELETE", f"/workers/{NIL_WORKER_ID}") in smg.calls
        assert not worker.draining

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
                Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30)
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
        assert serving(smg) == [other]

    def test_drain_parks_the_alias_first_so_that_clients_get_503_not_404(self, smg):
        smg.add()
        seen: list[list[str]] = []
        smg.at(0.01, lambda: seen.append([w.url for w in smg.workers]))
        make_router(smg).drain("primary-local")
        (parked,) = [w for w in smg.workers if w.labels.get(PARKED_LABEL) == "primary-local"]
        assert parked.models == [ALIAS] and parked.drain_s == PARK_SETTLE_S
        assert seen == [[BACKEND, parked.url]]  # parked before the tier's worker went

    def test_a_routed_chat_to_a_parked_alias_is_503_without_being_sent(self, smg):
        smg.add()
        router = make_router(smg)
        router.drain("primary-local")
        assert router.routed_chat(ALIAS) == RoutedAnswer(status=503, model=None)
        assert ("POST", "/v1/chat/completions") not in smg.calls  # smg would retry it, then say 503

    def test_a_park_for_this_process_s_next_route_is_handed_over_to_the_readmitted_serve(
        self, smg, monkeypatch
    ):
        handed: list[tuple[str, str]] = []
        monkeypatch.setattr(ParkingResponder, "hand_over", lambda _self, key, url: handed.append((key, url)))
        smg.add()
        router = make_router(smg)
        router.drain("primary-local", hold_s=3.0)
        (parked,) = [w for w in smg.workers if w.labels.get(PARKED_LABEL) == "primary-local"]
        readmit(router)
        assert handed == [(parked.url.rsplit("/", 1)[-1], BACKEND)]
        router.drain("primary-local")  # no hold asked: nothing is handed over at the next route
        readmit(router)
        assert len(handed) == 1
        router.close()

    def test_readmission_removes_the_parked_worker(self, smg):
        smg.add()
        router = make_router(smg)
        router.drain("primary-local")
        readmit(router)
        assert [w.url for w in smg.workers] == [BACKEND]

    def test_a_process_ending_with_the_tier_parked_leaves_smg_answering_503_itself(self, smg):
        smg.add()
        router = make_router(smg)
        router.drain("primary-local")
        router.close()
        (parked,) = smg.workers
        assert parked.draining and PARKED_LABEL in parked.labels  # unavailable: smg answers 503
        assert router_calls(smg, "DELETE", "/workers/") == 2  # the serve's worker, then the parked one

    def test_a_removal_that_never_finishes_is_transient(self, smg):
        smg.add()
        smg.drain_s = 10**9
        router = make_router(smg)
        router._removal_timeout_s = 0.05
        with pytest.raises(TransientError, match="removed"):
            router.deregister("primary-local", BACKEND)


class TestSmgRouterReadmit:
    def test_readmit_registers_and_ends_with_a_verified_routed_chat(self, smg):
        router = make_router(smg)
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30))
        assert smg.calls[-1] == ("POST", "/v1/chat/completions")
        assert router.routed_chat("llm.primary").model == "stub-model-a"

    def test_readmit_reregisters_a_healthy_worker_whose_breaker_is_open(self, smg):
        stuck = smg.add(breaker_open=True)
        router = make_router(smg)
        assert router.ready()
        assert router.routed_chat("llm.primary").status == 503
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30))
        assert stuck not in smg.workers
        assert router.routed_chat("llm.primary").status == 200

    def test_readmit_after_a_router_restart_registers_again(self, smg):
        smg.add()
        smg.workers.clear()  # a restarted smg remembers nothing
        make_router(smg).readmit(
            Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30)
        )
        assert [w.url for w in smg.workers] == [BACKEND]

    def test_readmit_removes_another_backend_of_the_tier(self, smg):
        smg.add(url="http://127.0.0.1:8009", served="candidate")
        make_router(smg).readmit(
            Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=30)
        )
        assert [w.url for w in smg.workers] == [BACKEND]

    def test_readmit_fails_at_the_deadline_when_the_wrong_model_answers(self, smg):
        smg.add(served="some-other-model")
        with pytest.raises(StepFailed) as err:
            make_router(smg).readmit(
                Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=0.3)
            )
        assert "some-other-model" in str(err.value)

    def test_readmit_retries_while_the_router_is_unreachable(self, smg):
        router = make_router(smg)
        smg.down = True
        with pytest.raises(StepFailed, match="ConnectError"):
            router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "m", deadline_s=0.3))

    def test_ready_is_false_when_the_router_is_down(self, smg):
        smg.down = True
        assert make_router(smg).ready() is False


def readmit(router: SmgRouter, deadline_s: float = 60, *, hold: bool = False) -> None:
    router.readmit(Readmission(TIER, BACKEND, (ALIAS,), MODEL, deadline_s=deadline_s, hold=hold))


def router_calls(smg: FakeSmg, method: str, prefix: str) -> int:
    return sum(1 for m, p in smg.calls if m == method and p.startswith(prefix))


def serving(smg: FakeSmg) -> list[FakeWorker]:
    """The workers that are not parked aliases."""
    return [w for w in smg.workers if PARKED_LABEL not in w.labels]


def stays_routed(smg: FakeSmg, router: SmgRouter, seconds: float) -> bool:
    """Advance the fake clock past any removal still queued; the route must hold throughout."""
    end = smg.now + seconds
    while smg.now < end:
        if not router.check_route(TIER, BACKEND, MODEL).holds:
            return False
        smg.sleep(0.5)
    return True


class TestSmgRouterRemovalHold:
    """A removal may be pending (asked, seen, or our own DELETE not seen land): hold past it."""

    def test_a_readmission_asked_to_hold_ends_only_after_the_hold_window(self, smg):
        readmit(make_router(smg, removal_hold_s=6.0), hold=True)
        assert smg.now >= 6.0
        assert router_calls(smg, "POST", "/workers") == 1

    def test_a_zero_hold_window_ends_at_the_first_verified_chat_even_when_asked(self, smg):
        readmit(make_router(smg, removal_hold_s=0), hold=True)
        assert smg.now < 1.0

    def test_a_removal_pending_at_readmission_is_waited_out_never_deleted_again(self, smg):
        smg.delete(smg.add())  # a killed process sent its DELETE
        router = make_router(smg)
        readmit(router)
        assert router_calls(smg, "DELETE", "/workers/") == 0
        (worker,) = smg.workers
        assert not worker.draining and smg.removals == []
        assert stays_routed(smg, router, 10)

    def test_a_late_removal_landing_after_registration_is_re_registered(self, smg):
        # Two DELETEs (a killed process, then a second one): the second removes the worker at
        # once and clears its job status; the first one's removal is still queued, invisible.
        # Nothing shows it: the caller (recover, after a crash) asks for the hold.
        old = smg.add()
        smg.delete(old)
        smg.sleep(0.5)
        smg.delete(old)
        assert smg.workers == [] and smg.jobs == {} and smg.removals
        router = make_router(smg)
        readmit(router, hold=True)
        assert router_calls(smg, "POST", "/workers") == 2  # registered, removed late, registered again
        assert smg.removals == []
        assert stays_routed(smg, router, 10)

    def test_a_removal_of_the_new_registration_during_the_hold_is_waited_out_and_held_again(self, smg):
        router = make_router(smg)
        smg.at(2.0, lambda: smg.delete(smg.at_url()))  # someone removes it mid-hold
        readmit(router, hold=True)
        assert router_calls(smg, "POST", "/workers") == 2
        assert router_calls(smg, "DELETE", "/workers/") == 0
        # Registered with no drain of its own, it went at once: nothing is left to wait out,
        # and the readmission still holds for the window it was asked to.
        assert smg.now >= 6.0
        assert stays_routed(smg, router, 10)

    def test_a_hold_that_cannot_finish_before_the_deadline_fails_the_readmission(self, smg):
        with pytest.raises(StepFailed, match="not yet held"):
            readmit(make_router(smg, removal_hold_s=600), deadline_s=5, hold=True)

    def test_an_own_delete_that_lands_early_is_held_past_the_removal_it_hid(self, smg):
        # A foreign DELETE lands between our look at the worker and our DELETE: ours then
        # removes the draining worker at once, and the foreign removal stays queued, hidden.
        worker, real_delete = smg.add(), smg.delete

        def raced(target: FakeWorker) -> None:
            smg.delete = real_delete  # type: ignore[method-assign]
            real_delete(target)  # the other client's DELETE, first
            real_delete(target)  # ours, on a draining worker: removed at once

        smg.delete = raced  # type: ignore[method-assign]
        router = make_router(smg)
        router.drain(TIER)
        assert worker not in smg.workers and smg.removals  # gone at once; a removal still queued
        readmit(router)  # nobody asked: the early landing of our own DELETE is the reason
        assert [r for r in smg.removals if r[1] == BACKEND] == []  # the parked URL's is its own
        # The parked alias, then the hidden removal took the first registration.
        assert router_calls(smg, "POST", "/workers") == 3
        assert stays_routed(smg, router, 10)

    def test_an_own_delete_whose_removal_was_never_seen_landing_holds(self, smg):
        worker = smg.add()
        router = make_router(smg, removal_timeout_s=1.0)  # gives up before smg's 5 s drain
        with pytest.raises(TransientError, match="removed"):
            router.drain(TIER)
        smg.delete(worker)  # someone's second DELETE: gone at once, our removal still queued
        assert serving(smg) == [] and smg.jobs == {} and smg.removals
        readmit(router)  # nothing visible is pending: our own unlanded DELETE is the reason
        assert [r for r in smg.removals if r[1] == BACKEND] == []  # the parked URL's is its own
        # The parked alias, then our late removal took the first registration.
        assert router_calls(smg, "POST", "/workers") == 3
        assert stays_routed(smg, router, 10)


class TestSmgRouterNoHold:
    """Nothing pending: a live transaction's readmission ends at its first verified routed chat."""

    def test_a_readmission_with_nothing_pending_does_not_wait_the_hold(self, smg):
        readmit(make_router(smg, removal_hold_s=6.0))
        assert smg.now < 1.0
        assert router_calls(smg, "POST", "/workers") == 1

    def test_a_readmission_after_its_own_drain_landed_does_not_wait_the_hold(self, smg):
        # What a live rollback does: drain (our DELETE, waited until gone), then readmit.
        smg.add()
        router = make_router(smg, removal_hold_s=6.0)
        router.drain(TIER)
        assert serving(smg) == [] and smg.removals == []
        drained = smg.now
        assert 5.0 <= drained < 5.5  # the removal landed after smg's drain
        readmit(router)
        assert smg.now - drained < 1.0
        assert stays_routed(smg, router, 10)

    def test_a_readmission_after_its_own_deregister_does_not_wait_the_hold(self, smg):
        smg.add(url="http://127.0.0.1:8009", served="candidate")
        router = make_router(smg, removal_hold_s=6.0)
        started = smg.now
        readmit(router)  # removes the other backend of the tier (its own DELETE), registers ours
        assert 5.0 <= smg.now - started < 6.0
        assert stays_routed(smg, router, 10)

    def test_register_does_not_keep_a_worker_whose_removal_is_pending(self, smg):
        smg.delete(smg.add())
        make_router(smg).register(TIER, BACKEND, (ALIAS,))
        (worker,) = smg.workers
        assert not worker.draining
        assert router_calls(smg, "DELETE", "/workers/") == 0


class TestSmgRouteCheck:
    def test_a_registered_admitted_routed_backend_holds(self, smg):
        smg.add()
        check = make_router(smg).check_route(TIER, BACKEND + "/", MODEL)
        assert check.holds and bool(check) and check.reason == ""
        assert check.url == BACKEND

    def test_an_absent_registration_does_not_hold(self, smg):
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "no worker" in check.reason

    def test_a_draining_registration_does_not_hold(self, smg):
        smg.delete(smg.add())
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "removal" in check.reason

    def test_a_queued_removal_does_not_hold_even_while_the_worker_reads_ready(self, smg):
        smg.add()
        smg.jobs[BACKEND] = {"job_type": "RemoveWorker", "status": "pending"}
        assert not make_router(smg).check_route(TIER, BACKEND, MODEL)

    def test_the_wrong_served_model_does_not_hold(self, smg):
        smg.add(served="some-other-model")
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "some-other-model" in check.reason

    def test_another_backend_in_the_tier_does_not_hold(self, smg):
        smg.add()
        smg.add(url="http://127.0.0.1:8009")
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "8009" in check.reason

    def test_an_open_breaker_does_not_hold(self, smg):
        smg.add(breaker_open=True)
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "503" in check.reason

    def test_an_unreachable_router_does_not_hold_and_does_not_raise(self, smg):
        smg.down = True
        check = make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert not check and "ConnectError" in check.reason

    def test_a_rejected_client_key_raises(self, smg):
        smg.add()
        with pytest.raises(AuthRejected):
            make_router(smg, client="wrong-key-1").check_route(TIER, BACKEND, MODEL)

    def test_it_changes_nothing(self, smg):
        smg.add()
        make_router(smg).check_route(TIER, BACKEND, MODEL)
        assert {m for m, p in smg.calls if p.startswith("/workers")} == {"GET"}


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


class TestParkingResponder:
    def test_passes_health_checks_and_answers_every_request_503_with_retry_after(self):
        responder = ParkingResponder()
        try:
            assert httpx.get(responder.url + "/health", timeout=5).status_code == 200
            assert httpx.get(responder.url + "/v1/models", timeout=5).status_code == 200
            answer = httpx.post(responder.url + "/v1/chat/completions", json={"model": ALIAS}, timeout=5)
            assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
            assert answer.json()["error"]["type"] == "server_error"
        finally:
            responder.close()

    def test_a_held_request_goes_on_to_the_serve_it_is_handed_over_to_and_streams_back(self):
        seen: list[tuple[str, dict[str, Any]]] = []
        with _engine(seen) as engine:
            responder = ParkingResponder()
            holding = threading.Event()
            wait = responder.wait_for_target
            responder.wait_for_target = lambda key: (holding.set(), wait(key))[1]  # type: ignore[method-assign]
            try:
                responder.hold("k1", 30.0)
                got: list[httpx.Response] = []
                body = {"model": ALIAS, "stream": True}
                url = f"{responder.url}/parked/k1/v1/chat/completions"
                asker = threading.Thread(target=lambda: got.append(httpx.post(url, json=body, timeout=30)))
                asker.start()
                assert holding.wait(10)
                assert seen == [] and not got  # held: not answered, not sent on yet
                responder.hand_over("k1", engine)
                asker.join(30)
                (answer,) = got
                assert answer.status_code == 200
                assert answer.text == "data: one\n\ndata: two\n\ndata: [DONE]\n\n"
                assert seen == [("/v1/chat/completions", body)]
            finally:
                responder.close()

    def test_a_request_held_past_the_hold_gets_the_503(self):
        responder = ParkingResponder()
        try:
            responder.hold("k2", 0.3)
            started = time.monotonic()
            answer = httpx.post(f"{responder.url}/parked/k2/v1/chat/completions", json={}, timeout=10)
            assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
            assert time.monotonic() - started >= 0.3
        finally:
            responder.close()

    def test_closing_answers_what_it_holds_503(self):
        responder = ParkingResponder()
        holding = threading.Event()
        wait = responder.wait_for_target
        responder.wait_for_target = lambda key: (holding.set(), wait(key))[1]  # type: ignore[method-assign]
        responder.hold("k3", 60.0)
        got: list[httpx.Response] = []
        url = f"{responder.url}/parked/k3/v1/chat/completions"
        asker = threading.Thread(target=lambda: got.append(httpx.post(url, json={}, timeout=30)))
        asker.start()
        assert holding.wait(10)
        responder.close()
        asker.join(30)
        assert [a.status_code for a in got] == [503]


@contextlib.contextmanager
def _engine(seen: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    """A serve on loopback that streams three SSE events (chunk by chunk) and records requests."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in (b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

    with loopback_server(Handler) as url:
        yield url


SMG_METRICS = """\
# HELP smg_worker_errors_total Worker-level errors by worker_type, connection_mode, error_type
# TYPE smg_worker_errors_total counter
smg_worker_errors_total{worker_type="regular",connection_mode="http",error_type="backend_error"} 4
# HELP smg_worker_cb_outcomes_total Circuit breaker outcomes by worker and outcome (success/failure)
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:41353",outcome="failure"} 4
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:41353",outcome="success"} 2
# TYPE smg_worker_requests_total counter
smg_worker_requests_total{worker="http://127.0.0.1:41353",model="llm.primary"} 6
"""
"""An excerpt of smg 1.13's Prometheus page after 2 good and 4 HTTP 500 answers of one worker."""
METRICS_URL = "http://127.0.0.1:29000/metrics"


def metrics_router(
    answer: Callable[[], httpx.Response] | None, metrics_url: str | None = METRICS_URL
) -> SmgRouter:
    """A router whose `metrics_url` answers `answer()` (the control plane is never asked)."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert str(request.url) == METRICS_URL and answer is not None, request.url
        return answer()

    creds = RouterCredentials(client=Secret(CLIENT, "env C"), admin=Secret(ADMIN, "env A"))
    return SmgRouter(
        "http://127.0.0.1:30000", creds, metrics_url=metrics_url, transport=httpx.MockTransport(handler)
    )


class TestSmgRouterErrors:
    def test_the_workers_failed_outcomes_are_its_errors(self):
        router = metrics_router(lambda: httpx.Response(200, text=SMG_METRICS))
        assert router.errors(TIER, "http://127.0.0.1:41353") == 4
        assert router.errors(TIER, "http://127.0.0.1:41353/") == 4

    def test_a_worker_without_a_failure_counted_has_none(self):
        router = metrics_router(lambda: httpx.Response(200, text=SMG_METRICS))
        assert router.errors(TIER, BACKEND) == 0  # smg_worker_errors_total has no worker label

    def test_without_a_metrics_url_the_count_is_absent_and_nothing_is_asked(self):
        assert metrics_router(None, metrics_url=None).errors(TIER, BACKEND) is None

    def test_an_unreachable_or_failing_page_is_transient(self):
        def refused() -> httpx.Response:
            raise httpx.ConnectError("connection refused")

        with pytest.raises(TransientError, match="29000"):
            metrics_router(refused).errors(TIER, BACKEND)
        with pytest.raises(TransientError, match="HTTP 503"):
            metrics_router(lambda: httpx.Response(503)).errors(TIER, BACKEND)
