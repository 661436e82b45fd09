"""The HAProxy adapter: generated config, socket permission checks, and the Runtime API
spoken to a fake HAProxy (a real Unix socket answering `show stat` / `set server`)."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path

import httpx
import pytest

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.haproxy import HaproxyRouter
from anvil_ctl.adapters.haproxy_config import check_socket, render_config, write_config
from anvil_ctl.core.errors import AdapterError, AuthRejected, CredentialError, StepFailed
from anvil_ctl.core.model import Readmission
from anvil_ctl.core.ports import Router, WeightedRouter

CLIENT = "client-token-xyz-123"
TIERS = {"primary-local": ("llm.primary", "llm.main"), "secondary": ("llm.second",)}
BACKEND = "http://127.0.0.1:8001"

HEADER = "# pxname,svname,qcur,status,addr,hrsp_5xx,eresp,econ,"


class FakeHaproxy:
    """Just enough Runtime API: servers per backend with addr, port and status."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.servers: dict[tuple[str, str], dict[str, object]] = {}
        for tier in TIERS:
            for n in (1, 2):
                self.servers[(f"tier_{tier}", f"s{n}")] = {
                    "addr": "127.0.0.1",
                    "port": 9,
                    "status": "MAINT",
                }
        self.commands: list[str] = []
        self.checked_up = True
        """Whether a server made ready passes its health check at once (else DOWN until one runs)."""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                line = conn.recv(4096).decode().strip()
                self.commands.append(line)
                conn.sendall(self.answer(line).encode())

    def answer(self, line: str) -> str:
        if line == "show info":
            return "Name: HAProxy\nVersion: 2.6.12\n"
        if line == "show stat":
            rows = [HEADER]
            for (be, sv), s in self.servers.items():
                errors = ",".join(str(s.get(k, 0)) for k in ("hrsp_5xx", "eresp", "econ"))
                rows.append(f"{be},{sv},0,{s['status']},{s['addr']}:{s['port']},{errors},")
            return "\n".join(rows) + "\n\n"
        words = line.split()
        if words[:2] == ["set", "server"]:
            be, sv = words[2].split("/")
            server = self.servers.get((be, sv))
            if server is None:
                return "No such server.\n"
            if words[3] == "addr":
                server["addr"], server["port"] = words[4], int(words[6])
                return "IP changed from '127.0.0.1' to ...\n"
            if words[3] == "weight":
                server["weight"] = words[4]
                return "\n"
            if words[3] == "state":
                ready = "UP" if self.checked_up else "DOWN"
                server["status"] = {"ready": ready, "drain": "DRAIN", "maint": "MAINT"}[words[4]]
                return "\n"
            if words[3] == "health":
                server["status"] = {"up": "UP", "down": "DOWN", "stopping": "NOLB"}[words[4]]
                return "\n"
        return "Unknown command.\n"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake(tmp_path: Path):
    server = FakeHaproxy(tmp_path / "admin.sock")
    yield server
    server.close()


def data_plane(served: str = "stub-model-a", on_chat=None):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/anvil/ready":
            return httpx.Response(200)
        if request.headers.get("authorization") != f"Bearer {CLIENT}":
            return httpx.Response(401)
        model = json.loads(request.content)["model"]
        if model not in TIERS["primary-local"]:
            return httpx.Response(404)
        if on_chat is not None:
            on_chat()
        return httpx.Response(200, json={"model": served, "choices": []})

    return httpx.MockTransport(handler)


def make_router(fake: FakeHaproxy, client: str = CLIENT, served: str = "stub-model-a", on_chat=None):
    creds = RouterCredentials(client=Secret(client, "file /etc/anvil/router.toml (client_token)"))
    return HaproxyRouter(
        "http://127.0.0.1:30080",
        fake.path,
        creds,
        TIERS,
        transport=data_plane(served, on_chat),
        sleep=lambda _s: None,
    )


def restart(fake: FakeHaproxy) -> None:
    """What a restarted HAProxy holds: the config's servers, all in maintenance."""
    for server in fake.servers.values():
        server.update(addr="127.0.0.1", port=9, status="MAINT")


class TestRenderConfig:
    def render(self, **kw):
        return render_config(
            TIERS,
            bind="127.0.0.1:30080",
            socket_path=Path("/run/anvil/admin.sock"),
            client_token=Secret(CLIENT, "env C"),
            **kw,
        )

    def test_one_backend_per_tier_with_slots_in_maintenance(self):
        text = self.render(slots=3)
        assert "backend tier_primary-local" in text
        assert "backend tier_secondary" in text
        assert text.count("disabled check") == 6

    def test_binds_loopback_sets_http_no_delay_and_an_admin_socket_mode_600(self):
        text = self.render()
        assert "bind 127.0.0.1:30080" in text
        assert "option http-no-delay" in text
        assert "stats socket /run/anvil/admin.sock mode 600 level admin" in text

    def test_a_slow_health_answer_is_given_seconds_not_the_check_interval(self):
        """Without `timeout check` a check must end within `inter` (300 ms in the tests)."""
        text = self.render(check_inter_ms=300)
        assert "default-server inter 300 " in text
        assert text.count("timeout check 2000ms") == len(TIERS)

    def test_the_client_token_appears_once_in_the_auth_acl(self):
        lines = [ln for ln in self.render().splitlines() if CLIENT in ln]
        assert len(lines) == 1
        assert "req.hdr(authorization)" in lines[0]

    def test_each_alias_routes_to_its_tier_and_others_get_404(self):
        text = self.render()
        assert r'"llm\.second"' in text
        assert "use_backend tier_secondary if alias_2" in text
        assert "return status 404" in text

    def test_a_token_haproxy_cannot_carry_is_refused_without_echoing_it(self):
        with pytest.raises(CredentialError) as err:
            render_config(
                TIERS,
                bind="127.0.0.1:1",
                socket_path=Path("/s"),
                client_token=Secret("a b'c" * 3, "env C"),
            )
        assert "a b'c" not in str(err.value)

    def test_an_alias_in_two_tiers_is_refused(self):
        with pytest.raises(AdapterError, match="listed by tiers"):
            render_config(
                {"a": ("x",), "b": ("x",)},
                bind="127.0.0.1:1",
                socket_path=Path("/s"),
                client_token=Secret(CLIENT, "c"),
            )

    def test_write_config_creates_the_file_owner_only(self, tmp_path):
        path = tmp_path / "haproxy.cfg"
        write_config(path, self.render())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


class TestCheckSocket:
    def test_a_private_socket_passes(self, fake):
        check_socket(fake.path)

    def test_a_world_writable_socket_is_refused(self, fake):
        os.chmod(fake.path, 0o666)
        with pytest.raises(CredentialError, match="world-writable"):
            check_socket(fake.path)
        with pytest.raises(CredentialError):
            make_router(fake).probe_credentials()
        assert fake.commands == []

    def test_a_regular_file_is_not_a_socket(self, tmp_path):
        path = tmp_path / "not.sock"
        path.write_text("")
        with pytest.raises(CredentialError, match="not a socket"):
            check_socket(path)


class TestHaproxyRouter:
    def test_it_implements_the_router_port(self, fake):
        assert isinstance(make_router(fake), Router)

    def test_probe_uses_the_socket_and_the_client_key(self, fake):
        make_router(fake).probe_credentials()
        assert fake.commands == ["show info"]

    def test_a_rejected_client_key_names_its_file(self, fake):
        with pytest.raises(AuthRejected) as err:
            make_router(fake, client="wrong-token-123").probe_credentials()
        assert "/etc/anvil/router.toml" in str(err.value)
        assert "wrong-token-123" not in str(err.value)

    def test_register_sets_addr_then_ready_on_a_free_slot(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        assert fake.commands[-3:] == [
            "set server tier_primary-local/s1 addr 127.0.0.1 port 8001",
            "set server tier_primary-local/s1 weight 100%",  # whatever a canary left in the slot
            "set server tier_primary-local/s1 state ready",
        ]
        (backend,) = router.backends("primary-local")
        assert (backend.url, backend.state, backend.healthy) == (BACKEND, "ready", True)

    def test_weights_go_to_the_servers_of_the_registered_urls(self, fake):
        router = make_router(fake)
        other = "http://127.0.0.1:8002"
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.register("primary-local", other, ("llm.primary",))
        router.set_weights("primary-local", {BACKEND: 90, other: 10})
        assert fake.commands[-2:] == [
            "set server tier_primary-local/s1 weight 90",
            "set server tier_primary-local/s2 weight 10",
        ]
        assert isinstance(router, WeightedRouter)

    def test_weighing_an_unregistered_url_or_out_of_range_changes_nothing(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        sent = len(fake.commands)
        with pytest.raises(AdapterError, match=r"no server for http://127\.0\.0\.1:8002 to weigh"):
            router.set_weights("primary-local", {"http://127.0.0.1:8002": 10})
        with pytest.raises(AdapterError, match="expected 0-256"):
            router.set_weights("primary-local", {BACKEND: 300})
        assert not [c for c in fake.commands[sent:] if c.startswith("set ")]

    def test_a_servers_errors_are_its_5xx_aborted_responses_and_failed_connections(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        assert router.errors("primary-local", BACKEND) == 0
        fake.servers[("tier_primary-local", "s1")].update(hrsp_5xx=3, eresp=1, econ=2)
        assert router.errors("primary-local", BACKEND) == 6
        assert router.errors("primary-local", "http://127.0.0.1:8999") is None  # not registered

    def test_register_twice_uses_one_slot(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.register("primary-local", BACKEND, ("llm.primary",))
        assert len(router.backends("primary-local")) == 1

    def test_an_alias_the_config_does_not_route_is_refused(self, fake):
        with pytest.raises(AdapterError, match="regenerate the config"):
            make_router(fake).register("primary-local", BACKEND, ("llm.unknown",))

    def test_an_unknown_tier_is_refused(self, fake):
        with pytest.raises(AdapterError, match="not in the haproxy config"):
            make_router(fake).drain("nope")

    def test_drain_then_deregister(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.drain("primary-local")
        assert [b.state for b in router.backends("primary-local")] == ["drain"]
        router.deregister("primary-local", BACKEND)
        assert router.backends("primary-local") == []

    def test_no_free_slot_is_an_adapter_error(self, fake):
        router = make_router(fake)
        router.register("secondary", "http://127.0.0.1:9001", ("llm.second",))
        router.register("secondary", "http://127.0.0.1:9002", ("llm.second",))
        with pytest.raises(AdapterError, match="no free server slot"):
            router.register("secondary", "http://127.0.0.1:9003", ("llm.second",))

    def test_readmit_leaves_one_backend_and_verifies_the_model(self, fake):
        router = make_router(fake)
        router.register("primary-local", "http://127.0.0.1:8009", ("llm.primary",))
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5))
        assert [b.url for b in router.backends("primary-local")] == [BACKEND]

    def test_readmit_gives_the_one_backend_full_weight_whatever_a_canary_left(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.set_weights("primary-local", {BACKEND: 0})
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5))
        assert fake.servers[("tier_primary-local", "s1")]["weight"] == "100%"

    def test_readmit_does_not_wait_for_the_next_health_check_of_a_serve_that_answers(self, fake):
        waits: list[float] = []
        router = make_router(fake)
        router._sleep = waits.append
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.drain("primary-local")
        # Its serve stopped and started again: HAProxy shows a drained server whose checks
        # failed as DOWN (not DRAIN), and a server made ready is DOWN until its next check.
        fake.servers[("tier_primary-local", "s1")]["status"] = "DOWN"
        fake.checked_up = False
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5))
        drained = fake.commands.index("set server tier_primary-local/s1 state drain")
        assert [c for c in fake.commands[drained + 1 :] if c.startswith("set ")][:2] == [
            "set server tier_primary-local/s1 state ready",
            "set server tier_primary-local/s1 health up",
        ]
        assert waits == []  # ended by the routed chat's answer, not by a retry
        assert fake.servers[("tier_primary-local", "s1")]["status"] == "UP"

    def test_readmit_after_an_haproxy_restart_registers_again(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        restart(fake)
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5))
        assert [b.url for b in router.backends("primary-local")] == [BACKEND]

    def test_readmit_fails_at_the_deadline_when_another_model_answers(self, fake):
        router = make_router(fake, served="other-model")
        with pytest.raises(StepFailed, match="other-model"):
            router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", 0.2))

    def test_a_missing_socket_makes_readmission_retry_until_the_deadline(self, fake, tmp_path):
        router = make_router(fake)
        router.socket_path = tmp_path / "gone.sock"
        with pytest.raises(StepFailed, match="does not exist"):
            router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", 0.2))

    def test_view_lists_live_slots_without_secrets(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        view = router.view("primary-local")
        assert view["backends"] == [
            {
                "url": BACKEND,
                "aliases": ["llm.primary", "llm.main"],
                "observed_model": None,
                "healthy": True,
                "state": "ready",
            }
        ]
        assert view["ready"] is True
        assert CLIENT not in json.dumps(view)

    def test_readmit_confirms_the_slot_is_still_ready_after_the_chat(self, fake):
        restarts = iter([True])  # haproxy restarts once, right after serving the first chat
        router = make_router(fake, on_chat=lambda: next(restarts, False) and restart(fake))
        router.readmit(Readmission("primary-local", BACKEND, ("llm.primary",), "stub-model-a", deadline_s=5))
        assert fake.commands.count("set server tier_primary-local/s1 state ready") == 2
        assert router.check_route("primary-local", BACKEND, "stub-model-a")


class TestHaproxyRouteCheck:
    def test_a_ready_routed_slot_holds(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        check = router.check_route("primary-local", BACKEND, "stub-model-a")
        assert check.holds and check.reason == ""

    def test_no_slot_at_the_url_does_not_hold(self, fake):
        check = make_router(fake).check_route("primary-local", BACKEND, "stub-model-a")
        assert not check and "points at" in check.reason

    def test_a_draining_slot_does_not_hold(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.drain("primary-local")
        check = router.check_route("primary-local", BACKEND, "stub-model-a")
        assert not check and "drain" in check.reason

    def test_another_ready_slot_does_not_hold(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        router.register("primary-local", "http://127.0.0.1:8009", ("llm.primary",))
        check = router.check_route("primary-local", BACKEND, "stub-model-a")
        assert not check and "8009" in check.reason

    def test_the_wrong_served_model_does_not_hold(self, fake):
        router = make_router(fake, served="other-model")
        router.register("primary-local", BACKEND, ("llm.primary",))
        check = router.check_route("primary-local", BACKEND, "stub-model-a")
        assert not check and "other-model" in check.reason

    def test_a_missing_socket_does_not_hold_and_does_not_raise(self, fake, tmp_path):
        router = make_router(fake)
        router.socket_path = tmp_path / "gone.sock"
        check = router.check_route("primary-local", BACKEND, "stub-model-a")
        assert not check and "does not exist" in check.reason

    def test_a_world_writable_socket_raises(self, fake):
        os.chmod(fake.path, 0o666)
        with pytest.raises(CredentialError):
            make_router(fake).check_route("primary-local", BACKEND, "stub-model-a")

    def test_it_changes_nothing(self, fake):
        router = make_router(fake)
        router.register("primary-local", BACKEND, ("llm.primary",))
        before = len(fake.commands)
        router.check_route("primary-local", BACKEND, "stub-model-a")
        assert all(not c.startswith("set ") for c in fake.commands[before:])
