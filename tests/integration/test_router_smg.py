"""The smg adapter against a real smg 1.13.0 process and stub engines in real containers.

Runs inside the loopback-only namespace of `scripts/testenv run -- ...`; smg is
started by scripts/routers.py bound to 127.0.0.1 with 1-2 s health intervals.
Measured durations are printed (`-s`) for the report.

smg 1.13 removes a DELETEd worker by URL after a fixed 5 s drain, whatever is
registered at that URL by then; the late-removal tests below reproduce what a
process killed right after its DELETE leaves behind, and watch the route for
longer than that delay.
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
from anvil_ctl.adapters.smg_workers import TIER_LABEL
from anvil_ctl.bootstrap import App
from anvil_ctl.commands import recheck, transactions
from anvil_ctl.commands.transactions import reconcile
from anvil_ctl.config.host import RouterConfig
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.model import Readmission
from anvil_ctl.core.states import TxState
from anvil_ctl.persistence.migrate import upgrade
from scripts.routers import Proc, start_smg
from tests.integration.conftest import find_free_port, stub_url

TIER, ALIAS, MODEL = "primary-local", "llm.primary", "stub-primary"
REMOVAL_DELAY_S = 5.2
"""smg 1.13's fixed drain before a removal lands, as measured (5.10-5.15 s), rounded up."""


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


def admin_delete(url: str, worker_id: str | None) -> httpx.Response:
    """What a process killed during `drain-tier` sent before it died."""
    return httpx.delete(
        f"{url}/workers/{worker_id}", headers={"Authorization": f"Bearer {Keys.admin}"}, timeout=10
    )


def route_breaks(router: SmgRouter, url: str, seconds: float) -> list[str]:
    """Watch the route for `seconds` (longer than a removal's delay); every reason it did not hold."""
    broken, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        check = router.check_route(TIER, url, MODEL)
        if not check.holds:
            broken.append(f"{time.monotonic() - end + seconds:.2f}s: {check.reason}")
        time.sleep(0.25)
    return broken


class TestSmgRouting:
    def test_readmit_registers_and_routes_the_alias_to_the_served_model(self, router, backend):
        seconds = timed(lambda: router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30)))
        print(f"\nsmg readmit (fresh registration): {seconds} s")
        answer = router.routed_chat(ALIAS)
        assert (answer.status, answer.model) == (200, MODEL)
        (b,) = router.backends(TIER)
        assert (b.url, b.healthy, b.models) == (stub_url(backend), True, (ALIAS,))
        view = router.view(TIER)
        assert view["backends"][0]["observed_model"] == MODEL
        assert view["ready"] is True

    def test_an_unknown_alias_is_refused(self, router, smg, backend):
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        response = chat(smg.url, "llm.unknown")
        assert response.status_code == 404

    def test_sse_passes_through(self, router, smg, backend):
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
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
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        result = run_acceptance(smg.url, ALIAS, MODEL, Secret(Keys.client, "env C"))
        assert result["passed"] is True, result
        assert Keys.client not in str(result)


class TestSmgQuiesceAndReadmit:
    def test_drain_stops_routing_and_readmit_restores_it(self, router, smg, backend):
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        seconds = timed(lambda: router.drain(TIER))
        print(f"\nsmg drain (delete + wait gone): {seconds} s")
        assert router.backends(TIER) == []
        assert chat(smg.url, ALIAS).status_code != 200
        seconds = timed(lambda: router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30)))
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
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
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
        seconds = timed(lambda: router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 60)))
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
                router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 90))
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
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        (old,) = router.backends(TIER)
        # A POST right after a DELETE of the same URL: the adapter registers its workers with
        # drain_settle_secs 0, so smg removes a DELETEd one at once and none is left pending.
        headers = {"Authorization": f"Bearer {Keys.admin}"}
        httpx.delete(f"{smg.url}/workers/{old.backend_id}", headers=headers, timeout=10)
        raced = httpx.post(
            f"{smg.url}/workers",
            headers=headers,
            json={"url": url, "models": [{"id": ALIAS}]},
            timeout=10,
        )
        print(f"\nsmg POST during pending DELETE: {raced.status_code} {raced.text[:120]}")
        assert raced.status_code == 202, raced.text
        wait_until(lambda: router._workers.at(url) is not None, "the raced registration to be listed", 10)
        # The raced registration lacks the tier's label: the adapter replaces it.
        seconds = timed(lambda: router.register(TIER, url, (ALIAS,)))
        print(f"smg register across a pending delete: {seconds} s")
        (new,) = router.backends(TIER)
        assert new.backend_id != old.backend_id
        seconds = timed(lambda: router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30)))
        assert router.routed_chat(ALIAS).status == 200


class TestSmgLateRemoval:
    def test_a_delete_sent_just_before_readmission_cannot_undo_it(self, router, smg, backend):
        url = stub_url(backend)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        (old,) = router.backends(TIER)
        assert admin_delete(smg.url, old.backend_id).status_code == 202  # ... and the sender died
        seconds = timed(lambda: router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 60)))
        print(f"\nsmg readmit right after a DELETE of the same worker: {seconds} s")
        assert router.check_route(TIER, url, MODEL).holds
        assert route_breaks(router, url, REMOVAL_DELAY_S + 2) == []
        (new,) = router.backends(TIER)
        assert new.backend_id != old.backend_id

    def test_a_hidden_pending_removal_lands_and_readmission_registers_again(self, router, smg, backend):
        # The sequence: a DELETE from the killed process, then a second DELETE (the old
        # readmission's) that removes the draining worker at once and clears its job status,
        # so the first removal is pending but invisible when readmission registers again.
        url = stub_url(backend)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        (old,) = router.backends(TIER)
        admin_delete(smg.url, old.backend_id)
        time.sleep(0.5)
        admin_delete(smg.url, old.backend_id)
        wait_until(lambda: router.backends(TIER) == [], "the second DELETE to remove the worker", 5)
        # Nothing shows the hidden removal: the caller (recover, after the crash) asks for the hold.
        seconds = timed(lambda: router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 60, hold=True)))
        print(f"\nsmg readmit across a hidden pending removal: {seconds} s")
        assert route_breaks(router, url, REMOVAL_DELAY_S + 2) == []

    def test_the_cost_of_the_hold_on_a_clean_readmission(self, smg, backend, closing):
        url = stub_url(backend)
        held = closing(SmgRouter(smg.url, creds()))
        unheld = closing(SmgRouter(smg.url, creds(), removal_hold_s=0))
        without = timed(lambda: unheld.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30)))
        unheld.drain(TIER)
        with_hold = timed(lambda: held.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30, hold=True)))
        print(f"\nsmg clean readmit: {without} s without the hold, {with_hold} s with a 6 s hold")
        assert with_hold >= 6.0 > without
        assert held.check_route(TIER, url, MODEL).holds

    def test_a_readmission_after_its_own_drain_does_not_wait_the_hold(self, router, smg, backend):
        # What a live promote or rollback does: drain the tier (our DELETE of a worker we
        # registered with drain_settle_secs 0: removed at once), then readmit. Nothing can be
        # pending: no hold, and no fixed wait in the drain either.
        url = stub_url(backend)
        router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30))
        drained = timed(lambda: router.drain(TIER))
        assert drained < REMOVAL_DELAY_S - 2  # smg's fixed drain is not in it
        seconds = timed(lambda: router.readmit(Readmission(TIER, url, (ALIAS,), MODEL, 30)))
        print(f"\nsmg drain {drained} s, then readmit {seconds} s (hold {router._hold_s} s not waited)")
        assert seconds < router._hold_s - 2
        assert route_breaks(router, url, REMOVAL_DELAY_S + 2) == []

    def test_route_check_reads_a_pending_removal_as_not_holding(self, router, smg, backend):
        url = stub_url(backend)
        # Registered by someone else, with smg's own drain: a DELETE leaves it draining.
        body = {"url": url, "models": [{"id": ALIAS}], "labels": {TIER_LABEL: TIER}}
        headers = {"Authorization": f"Bearer {Keys.admin}"}
        assert httpx.post(f"{smg.url}/workers", headers=headers, json=body, timeout=10).status_code == 202
        wait_until(
            lambda: router.check_route(TIER, url, MODEL).holds, "the foreign registration to route", 20
        )
        (old,) = router.backends(TIER)
        admin_delete(smg.url, old.backend_id)
        check = router.check_route(TIER, url, MODEL)
        assert not check.holds and "removal" in check.reason
        wait_until(lambda: router.backends(TIER) == [], "the removal to land", 10)
        check = router.check_route(TIER, url, MODEL)
        assert not check.holds and "no worker" in check.reason
        assert not router.check_route(TIER, url, "another-model").holds


HOST_TOML = """
host = "router-it"
[slots.primary]
binding = "127.0.0.1:{port}"
router_tier = "primary-local"
aliases = ["llm.primary"]
[router]
kind = "smg"
url = "{router_url}"
readmit_deadline_s = 60
[policy]
stop_timeout_s = 5
health_poll_s = 0.1
"""


@pytest.fixture
def smg_host(
    tmp_path: Path, smg_factory: Callable[..., Proc], stub_container: Any
) -> Iterator[dict[str, Any]]:
    """A host whose slot `primary` is a stub incumbent in a real container, behind a real smg."""
    smg = smg_factory()
    port = find_free_port()
    (tmp_path / "anvil.toml").write_text(HOST_TOML.format(port=port, router_url=smg.url))
    settings = Settings(  # type: ignore[call-arg]
        state_dir=tmp_path / "state", config=tmp_path / "anvil.toml", backend="real", gpu="simulated"
    )
    env = {"ANVIL_ROUTER_ADMIN_TOKEN": Keys.admin, "ANVIL_ROUTER_CLIENT_TOKEN": Keys.client}
    app = App(settings=settings, env=env)
    upgrade(app.create_database())
    inc = stub_container(
        served_model=MODEL, port=port, labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"}
    )
    out = transactions.adopt(app, slot="primary", container_id=inc.id, context_tokens=32768)
    assert out.state == TxState.COMMITTED, out.reason
    yield {"app": app, "smg": smg, "smg_port": int(smg.url.rsplit(":", 1)[1]), "incumbent": inc}
    app.world().close()  # the router's and Docker's connections
    app.database.dispose()


class TestReconcileOnSmg:
    def test_a_restarted_smg_gets_the_route_back_from_reconcile(self, smg_host, smg_factory, closing):
        app = smg_host["app"]
        first = reconcile(app, "primary")  # nothing was registered yet: reconcile routes it
        assert first.state == TxState.COMMITTED, first.reason
        url = stub_url(smg_host["incumbent"])
        router = closing(SmgRouter(smg_host["smg"].url, creds()))
        assert router.check_route(TIER, url, MODEL).holds
        smg_host["smg"].kill()  # smg dies and comes back without its registrations
        smg_factory(port=smg_host["smg_port"])
        assert "no worker" in router.check_route(TIER, url, MODEL).reason
        started = time.monotonic()
        out = reconcile(app, "primary")
        print(f"\nreconcile after an smg restart: {time.monotonic() - started:.2f} s")
        assert out.state == TxState.COMMITTED, out.reason
        assert out.results["route-slot"]["changed"] is True
        assert out.results["routed-smoke"] == {
            "alias": ALIAS,
            "status": 200,
            "model": MODEL,
            "served_model": MODEL,
        }
        assert route_breaks(router, url, REMOVAL_DELAY_S + 1) == []
        again = reconcile(app, "primary")
        assert again.results["route-slot"]["already_routed"] is True

    def test_recheck_repairs_the_route_after_an_smg_restart(self, smg_host, smg_factory):
        app = smg_host["app"]
        assert reconcile(app, "primary").state == TxState.COMMITTED
        smg_host["smg"].kill()
        smg_factory(port=smg_host["smg_port"])
        plain = recheck.recheck(app, "primary")
        assert {"route_holds", "routed_smoke"} <= set(plain.failed)
        repaired = recheck.recheck(app, "primary", repair=("router",))
        assert repaired.passed, repaired.assertions
        assert repaired.repair is not None and repaired.repair["committed"] is True

    def test_reconcile_is_refused_when_the_recorded_serve_is_not_running(self, smg_host, runtime, closing):
        app, inc = smg_host["app"], smg_host["incumbent"]
        router = closing(SmgRouter(smg_host["smg"].url, creds()))
        runtime.stop(inc.id, 5)
        out = reconcile(app, "primary")
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "RecordedServeRunning"
        assert f"{inc.id[:12]} ({MODEL}) is exited, not running" in out.reason
        assert router.backends(TIER) == []  # nothing was registered


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
        router.readmit(Readmission(TIER, stub_url(backend), (ALIAS,), MODEL, 30))
        cmdline = Path(f"/proc/{smg.pid}/cmdline").read_bytes().decode(errors="replace")
        text = cmdline + smg.log_path.read_text(errors="replace")
        for token in (Keys.admin, Keys.client, Keys.user):
            assert token not in text
        assert not list(smg.log_path.parent.glob(".smg-argv-*"))
