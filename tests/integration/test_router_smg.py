"""The smg adapter against a real smg 1.13.0 process and stub engines in real containers.

Runs inside the loopback-only namespace of `scripts/testenv run -- ...`; smg is
started by scripts/routers.py bound to 127.0.0.1 with 1-2 s health intervals.
Measured durations are printed (`-s`) for the report.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.acceptance import run_acceptance
from anvil_ctl.adapters.credentials import RouterCredentials, Secret, resolve_credentials
from anvil_ctl.adapters.smg import SmgRouter
from anvil_ctl.config import RouterConfig
from anvil_ctl.core.errors import AuthRejected, CredentialError
from scripts.routers import Proc, start_smg
from tests.integration.conftest import stub_url

TIER, ALIAS, MODEL = "primary-local", "llm.primary", "stub-primary"


class Keys:
    admin = "adm-" + secrets.token_hex(12)
    user = "usr-" + secrets.token_hex(12)
    client = "cli-" + secrets.token_hex(12)


@pytest.fixture
def smg_factory(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def make(**kw: Any) -> Proc:
        proc = start_smg(
            workdir=tmp_path / "smg",
            admin_token=Keys.admin,
            client_token=Keys.client,
            user_token=Keys.user,
            **kw,
        )
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop()


def creds(admin: str = Keys.admin, client: str = Keys.client) -> RouterCredentials:
    return RouterCredentials(
        admin=Secret(admin, "env ANVIL_ROUTER_ADMIN_TOKEN"),
        client=Secret(client, "env ANVIL_ROUTER_CLIENT_TOKEN"),
    )


@pytest.fixture
def closing() -> Iterator[Callable[[SmgRouter], SmgRouter]]:
    """Register routers for closing at teardown, pass or fail."""
    made: list[SmgRouter] = []

    def keep(router: SmgRouter) -> SmgRouter:
        made.append(router)
        return router

    yield keep
    for router in made:
        router.close()


@pytest.fixture
def smg(smg_factory: Callable[..., Proc]) -> Proc:
    return smg_factory()


@pytest.fixture
def router(smg: Proc) -> Iterator[SmgRouter]:
    r = SmgRouter(smg.url, creds())
    yield r
    r.close()


@pytest.fixture
def backend(stub_container: Any) -> Any:
    return stub_container(served_model=MODEL)


def timed(fn: Callable[[], object]) -> float:
    started = time.monotonic()
    fn()
    return round(time.monotonic() - started, 2)


def chat(url: str, model: str, key: str = Keys.client) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "Reply with exactly: hi"}]},
        timeout=10,
    )


def backend_healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class TestSmgRouting:
    def test_readmit_registers_and_routes_the_alias_to_the_served_model(self, router, backend):
        seconds = timed(lambda: router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        print(f"\nsmg readmit (fresh registration): {seconds} s")
        answer = router.routed_chat(ALIAS)
        assert (answer.status, answer.model) == (200, MODEL)
        (b,) = router.backends(TIER)
        assert (b.url, b.healthy, b.models) == (stub_url(backend), True, (ALIAS,))
        view = router.view(TIER)
        assert view["backends"][0]["observed_model"] == MODEL
        assert view["ready"] is True

    def test_an_unknown_alias_is_refused(self, router, smg, backend):
        router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30)
        response = chat(smg.url, "llm.unknown")
        assert response.status_code == 404

    def test_sse_passes_through(self, router, smg, backend):
        router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30)
        lines = []
        with httpx.stream(
            "POST",
            f"{smg.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {Keys.client}"},
            json={"model": ALIAS, "stream": True, "messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in response.iter_lines() if ln.startswith("data: ")]
        assert len(lines) > 2
        assert lines[-1] == "data: [DONE]"
        assert f'"model": "{MODEL}"' in lines[0] or f'"model":"{MODEL}"' in lines[0]

    def test_the_official_openai_client_passes_acceptance(self, router, smg, backend):
        router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30)
        result = run_acceptance(smg.url, ALIAS, MODEL, Secret(Keys.client, "env C"))
        assert result.passed, result.as_dict()
        assert Keys.client not in str(result.as_dict())


class TestSmgQuiesceAndReadmit:
    def test_drain_stops_routing_and_readmit_restores_it(self, router, smg, backend):
        router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30)
        seconds = timed(lambda: router.drain(TIER))
        print(f"\nsmg drain (delete + wait gone): {seconds} s")
        assert router.backends(TIER) == []
        assert chat(smg.url, ALIAS).status_code != 200
        seconds = timed(lambda: router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        print(f"smg readmit after drain: {seconds} s")
        assert router.routed_chat(ALIAS).status == 200

    def test_circuit_breaker_case_readiness_lies_until_readmission(
        self, smg_factory, stub_container, runtime, closing
    ):
        smg = smg_factory(
            health_interval_s=2,
            health_failure_threshold=2,
            cb_failure_threshold=2,
            cb_timeout_s=60,
        )
        router = closing(SmgRouter(smg.url, creds()))
        info = stub_container(served_model=MODEL)
        url = stub_url(info)
        router.readmit(TIER, url, (ALIAS,), MODEL, 30)
        runtime.stop(info.id, 5)  # the backend restarts: first it goes away ...
        failures = [router.routed_chat(ALIAS).status for _ in range(4)]
        assert all(status >= 500 for status in failures), failures
        runtime.start(info.id)  # ... then the same container comes back
        wait_until(lambda: backend_healthy(url), "the restarted backend's /health")
        time.sleep(2.5)  # at least one more smg health check of the live backend
        wait_until(
            lambda: router.ready() and all(b.healthy for b in router.backends(TIER)),
            "smg to read the worker healthy",
        )
        # Readiness says 200 and the worker reads healthy, yet routed chat fails.
        assert router.ready() is True
        assert [b.healthy for b in router.backends(TIER)] == [True]
        assert router.routed_chat(ALIAS).status == 503
        seconds = timed(lambda: router.readmit(TIER, url, (ALIAS,), MODEL, 60))
        print(f"\nsmg readmit with an open circuit breaker: {seconds} s")
        answer = router.routed_chat(ALIAS)
        assert (answer.status, answer.model) == (200, MODEL)

    def test_router_restarted_mid_readmission_recovers(self, smg_factory, stub_container, runtime, closing):
        smg = smg_factory()
        port = int(smg.url.rsplit(":", 1)[1])
        router = closing(SmgRouter(smg.url, creds()))
        info = stub_container(served_model=MODEL)
        url = stub_url(info)
        runtime.stop(info.id, 5)  # readmission cannot finish yet
        errors: list[BaseException] = []
        started = time.monotonic()

        def readmit() -> None:
            try:
                router.readmit(TIER, url, (ALIAS,), MODEL, 90)
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=readmit)
        worker.start()
        time.sleep(3)
        smg.kill()  # the router crashes mid-readmission and loses its registrations
        smg_factory(port=port)
        runtime.start(info.id)
        worker.join(120)
        print(f"\nsmg readmission across a router restart: {time.monotonic() - started:.2f} s")
        assert not worker.is_alive()
        assert errors == []
        assert router.routed_chat(ALIAS).status == 200

    def test_delete_post_race_is_absorbed(self, router, smg, backend):
        url = stub_url(backend)
        router.readmit(TIER, url, (ALIAS,), MODEL, 30)
        (old,) = router.backends(TIER)
        # What smg does on its own: a POST right after a DELETE of the same URL.
        headers = {"Authorization": f"Bearer {Keys.admin}"}
        httpx.delete(f"{smg.url}/workers/{old.backend_id}", headers=headers, timeout=10)
        raced = httpx.post(
            f"{smg.url}/workers",
            headers=headers,
            json={"url": url, "models": [{"id": ALIAS}]},
            timeout=10,
        )
        print(f"\nsmg POST during pending DELETE: {raced.status_code} {raced.text[:120]}")
        assert raced.status_code == 409 or old.backend_id in raced.text
        # The adapter waits for the removal before it posts again.
        seconds = timed(lambda: router.register(TIER, url, (ALIAS,)))
        print(f"smg register across a pending delete: {seconds} s")
        (new,) = router.backends(TIER)
        assert new.backend_id != old.backend_id
        seconds = timed(lambda: router.readmit(TIER, url, (ALIAS,), MODEL, 30))
        assert router.routed_chat(ALIAS).status == 200


class TestSmgCredentials:
    def test_a_wrong_admin_key_is_auth_rejected_401(self, smg):
        with (
            SmgRouter(smg.url, creds(admin="wrong-" + secrets.token_hex(8))) as r,
            pytest.raises(AuthRejected) as err,
        ):
            r.probe_credentials()
        assert err.value.data["status"] == 401
        assert "env ANVIL_ROUTER_ADMIN_TOKEN" in str(err.value)

    def test_a_user_role_key_is_auth_rejected_403(self, smg):
        with SmgRouter(smg.url, creds(admin=Keys.user)) as r, pytest.raises(AuthRejected) as err:
            r.probe_credentials()
        assert err.value.data["status"] == 403
        assert Keys.user not in str(err.value)

    def test_a_wrong_client_key_is_auth_rejected_401(self, smg):
        with (
            SmgRouter(smg.url, creds(client="wrong-" + secrets.token_hex(8))) as r,
            pytest.raises(AuthRejected) as err,
        ):
            r.probe_credentials()
        assert err.value.data["status"] == 401
        assert "env ANVIL_ROUTER_CLIENT_TOKEN" in str(err.value)

    def test_a_world_readable_credential_file_is_refused_and_0600_works(self, smg, tmp_path):
        path = tmp_path / "router.toml"
        path.write_text(f'admin_token = "{Keys.admin}"\nclient_token = "{Keys.client}"\n')
        path.chmod(0o644)
        config = RouterConfig(url=smg.url, credential_file=path)
        with pytest.raises(CredentialError, match="0644"):
            resolve_credentials(config, {})
        path.chmod(0o600)
        with SmgRouter(smg.url, resolve_credentials(config, {})) as r:
            r.probe_credentials()

    def test_no_token_reaches_smg_command_line_or_log(self, smg, router, backend):
        router.readmit(TIER, stub_url(backend), (ALIAS,), MODEL, 30)
        cmdline = Path(f"/proc/{smg.pid}/cmdline").read_bytes().decode(errors="replace")
        text = cmdline + smg.log_path.read_text(errors="replace")
        for token in (Keys.admin, Keys.client, Keys.user):
            assert token not in text
        assert not list(smg.log_path.parent.glob(".smg-argv-*"))
