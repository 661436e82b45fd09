"""The HAProxy adapter against a real HAProxy 2.6 process and stub engines in real containers.

HAProxy is started by scripts/routers.py bound to 127.0.0.1 with 300 ms checks,
inside the loopback-only namespace of `scripts/testenv run -- ...`.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.acceptance import run_acceptance
from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.model import Readmission
from scripts.routers import Proc, start_haproxy
from tests.integration.conftest import stub_url

TIER, ALIAS, MODEL = "primary-local", "llm.primary", "stub-primary"
TIERS = {TIER: (ALIAS,), "secondary": ("llm.secondary",)}
CLIENT = "cli-" + secrets.token_hex(12)


@pytest.fixture
def haproxy_factory(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def make(**kw: Any) -> Proc:
        proc = start_haproxy(workdir=tmp_path / "hp", tiers=TIERS, client_token=CLIENT, **kw)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
def haproxy(haproxy_factory: Callable[..., Proc]) -> Proc:
    return haproxy_factory()


def make_router(proc: Proc, client: str = CLIENT) -> HaproxyRouter:
    creds = RouterCredentials(client=Secret(client, "env ANVIL_ROUTER_CLIENT_TOKEN"))
    return HaproxyRouter(proc.url, Path(proc.extra["socket"]), creds, TIERS)


@pytest.fixture
def router(haproxy: Proc) -> Iterator[HaproxyRouter]:
    with make_router(haproxy) as r:
        yield r


@pytest.fixture
def backend(stub_container: Any) -> Any:
    return stub_container(served_model=MODEL)


def _eventually(check: Callable[[], bool], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def post_chat(url: str, model: str, key: str = CLIENT, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "x"}], **extra},
        timeout=10,
    )


class TestHaproxyRouting:
    def test_readmit_routes_the_alias_to_the_served_model(self, router, backend):
        started = time.monotonic()
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        print(f"\nhaproxy readmit (fresh): {time.monotonic() - started:.2f} s")
        answer = router.routed_chat(ALIAS)
        assert (answer.status, answer.model) == (200, MODEL)
        assert router.ready() is True
        assert router.view(TIER)["backends"][0]["url"] == stub_url(backend)

    def test_an_unknown_alias_gets_404_and_a_wrong_key_401(self, router, haproxy, backend):
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        assert post_chat(haproxy.url, "llm.unknown").status_code == 404
        assert post_chat(haproxy.url, ALIAS, key="wrong-" + CLIENT).status_code == 401
        assert post_chat(haproxy.url, "llm.secondary").status_code == 503  # no backend yet

    def test_sse_passes_through_unbuffered(self, router, haproxy, stub_container):
        slow = stub_container(served_model=MODEL, extra_args=["--decode-tps", "20"])
        router.readmit(Readmission(TIER, stub_url(slow), (ALIAS,), MODEL, 30))
        arrivals = []
        started = time.monotonic()
        with httpx.stream(
            "POST",
            f"{haproxy.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {CLIENT}"},
            json={"model": ALIAS, "stream": True, "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    arrivals.append((time.monotonic() - started, line))
        assert arrivals[-1][1] == "data: [DONE]"
        # Chunks arrive spread over time, not all at once at the end.
        assert arrivals[-1][0] - arrivals[0][0] > 0.2

    def test_the_official_openai_client_passes_acceptance(self, router, haproxy, backend):
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        result = run_acceptance(haproxy.url, ALIAS, MODEL, Secret(CLIENT, "env C"))
        assert result["passed"] is True, result


class TestHaproxyQuiesceAndReadmit:
    def test_a_drained_server_counts_what_it_still_answers_and_new_requests_get_503_retry_after(
        self, router, haproxy, stub_container
    ):
        slow = stub_container(served_model=MODEL, extra_args=["--decode-tps", "10", "--verbose-default"])
        url = stub_url(slow)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        done: list[int] = []
        worker = threading.Thread(
            target=lambda: done.append(post_chat(haproxy.url, ALIAS, max_tokens=30).status_code)
        )
        worker.start()
        assert _eventually(lambda: router.in_flight(TIER, url) == 1), router.in_flight(TIER, url)
        router.drain(TIER)
        refused = post_chat(haproxy.url, ALIAS)
        assert (refused.status_code, refused.headers.get("retry-after")) == (503, "1")
        assert router.in_flight(TIER, url) == 1  # still answering, counted while it drains
        worker.join(30)
        assert done == [200]
        assert _eventually(lambda: router.in_flight(TIER, url) == 0)

    def test_drain_lets_in_flight_finish_refuses_new_and_readmit_restores(
        self, router, haproxy, stub_container
    ):
        slow = stub_container(served_model=MODEL, extra_args=["--decode-tps", "10"])
        url = stub_url(slow)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        done: list[int] = []

        def long_request() -> None:
            done.append(post_chat(haproxy.url, ALIAS, max_tokens=20).status_code)

        worker = threading.Thread(target=long_request)
        worker.start()
        assert _eventually(lambda: router.in_flight(TIER, url) == 1), router.in_flight(TIER, url)
        router.drain(TIER)
        assert [b.state for b in router.backends(TIER)] == ["drain"]
        assert post_chat(haproxy.url, ALIAS).status_code == 503
        worker.join(30)
        assert done == [200]
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        assert router.routed_chat(ALIAS).status == 200

    def test_backend_restarted_then_readmitted(self, router, backend, runtime):
        url = stub_url(backend)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        runtime.stop(backend.id, 5)
        assert router.routed_chat(ALIAS).status >= 500
        runtime.start(backend.id)
        started = time.monotonic()
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        print(f"\nhaproxy readmit after backend restart: {time.monotonic() - started:.2f} s")
        assert router.routed_chat(ALIAS).model == MODEL

    def test_haproxy_restarted_mid_readmission_recovers(self, haproxy_factory, stub_container):
        proc = haproxy_factory()
        port = int(proc.url.rsplit(":", 1)[1])
        info = stub_container(served_model=MODEL)
        with make_router(proc) as router:
            router.readmit(Readmission(TIER, stub_url(info), (ALIAS,), MODEL, 30))
            proc.kill()  # runtime state (addr, ready) is lost with the process
            errors: list[BaseException] = []
            started = time.monotonic()

            def readmit() -> None:
                try:
                    router.readmit(Readmission(TIER, stub_url(info), (ALIAS,), MODEL, 60))
                except BaseException as exc:
                    errors.append(exc)

            worker = threading.Thread(target=readmit)
            worker.start()
            time.sleep(1.5)
            haproxy_factory(port=port)
            worker.join(90)
            print(f"\nhaproxy readmission across a router restart: {time.monotonic() - started:.2f} s")
            assert errors == []
            assert router.routed_chat(ALIAS).status == 200


def route_breaks(router: HaproxyRouter, url: str, seconds: float) -> list[str]:
    """Watch the route for `seconds`; every reason it did not hold."""
    broken, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        check = router.check_route(TIER, url, MODEL)
        if not check.holds:
            broken.append(check.reason)
        time.sleep(0.25)
    return broken


class TestHaproxyRuntimeApiIsSynchronous:
    def test_maint_and_ready_apply_at_once_and_nothing_lands_later(self, router, haproxy, backend):
        url = stub_url(backend)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        router.deregister(TIER, url)  # `set server ... state maint`
        assert router.backends(TIER) == []  # the very next `show stat` reads it
        assert post_chat(haproxy.url, ALIAS).status_code == 503  # and the very next request obeys
        started = time.monotonic()
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        print(f"\nhaproxy readmit right after maint (confirm included): {time.monotonic() - started:.2f} s")
        assert post_chat(haproxy.url, ALIAS).status_code == 200
        assert route_breaks(router, url, 6) == []  # nothing queued undoes it later (unlike smg)

    def test_route_check_follows_drain_and_maintenance(self, router, backend):
        url = stub_url(backend)
        assert "points at" in router.check_route(TIER, url, MODEL).reason
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        assert router.check_route(TIER, url, MODEL).holds
        assert "answered from" in router.check_route(TIER, url, "another-model").reason
        router.drain(TIER)
        assert "drain" in router.check_route(TIER, url, MODEL).reason
        router.deregister(TIER, url)
        assert not router.check_route(TIER, url, MODEL).holds


class TestHaproxyCredentials:
    def test_a_wrong_client_key_is_auth_rejected(self, haproxy):
        with make_router(haproxy, client="wrong-" + CLIENT) as r, pytest.raises(AuthRejected) as e:
            r.probe_credentials()
        assert e.value.data["status"] == 401
        assert CLIENT not in str(e.value)

    def test_a_world_writable_admin_socket_is_refused(self, haproxy, router):
        router.probe_credentials()
        sock = Path(haproxy.extra["socket"])
        os.chmod(sock, 0o666)
        with pytest.raises(CredentialError, match="world-writable"):
            router.probe_credentials()

    def test_config_holding_the_token_is_owner_only_and_logs_hold_none(self, haproxy, router):
        config = Path(haproxy.extra["config"])
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        router.probe_credentials()
        assert CLIENT not in haproxy.log_path.read_text(errors="replace")
        cmdline = Path(f"/proc/{haproxy.pid}/cmdline").read_bytes().decode(errors="replace")
        assert CLIENT not in cmdline
