"""The router's start hook heals the route in seconds after a restart that follows a promote.

smg keeps its workers in memory: restarted, it answers 404 `model_not_found` for
`llm.primary` until the route is re-applied. The shipped hooks run `anvilctl recheck
--repair router --wait-router 60s` when the router starts: the systemd drop-in on the
router's unit (`contrib/systemd/anvil-route-repair.conf`, its ExecStartPost line run here as
systemd runs it, started with the router and before it listens) and the watcher of a
container-run router (`contrib/anvil-router-watch`, following Docker's events while smg runs
in a container and `docker restart` restarts it; the repair runs in the watcher's process).
Each test promotes, restarts the router and polls the route through the router with the
client key until it answers with the promoted model, within a deadline; the seconds from the
router's new start to that answer are printed (`-s`). HAProxy run in a
container (its Runtime API changes forgotten at a restart) is healed by the same watcher.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.core.states import TxState
from scripts.campaign import verified_decision
from scripts.routers import Proc, free_port, smg_argv, start_smg
from tests.integration.test_recheck_campaign import CANDIDATE, close_host, loaded_host
from tests.integration.test_router_smg import Keys

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DROP_IN = REPO / "contrib" / "systemd" / "anvil-route-repair.conf"
WATCHER = REPO / "contrib" / "anvil-router-watch"
HEAL_DEADLINE_S = 60.0
VENV = Path(sys.executable).parent.parent


def routed(router_url: str, client_token: str = Keys.client) -> tuple[int, str | None]:
    try:
        r = httpx.post(
            f"{router_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {client_token}"},
            json={"model": "llm.primary", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=5,
        )
    except httpx.TransportError as exc:
        return 0, type(exc).__name__
    return r.status_code, r.json().get("model") if r.status_code == 200 else r.text[:120]


def heal_time(router_url: str, since: float, what: list[Any]) -> float:
    """Poll the route until it answers 200 with the promoted model; seconds since `since`."""
    deadline = time.monotonic() + HEAL_DEADLINE_S
    while time.monotonic() < deadline:
        status, model = routed(router_url)
        what.append((status, model))
        if status == 200 and model == CANDIDATE:
            return time.monotonic() - since
        time.sleep(0.2)
    raise AssertionError(f"the route did not heal within {HEAL_DEADLINE_S} s; last answers {what[-3:]}")


def reconciles(host: dict[str, Any]) -> int:
    """Committed route repairs (`reconcile` transactions) recorded on the host so far."""
    return len(audit.transactions(host["app"], kind="reconcile", state="committed", limit=100))


def promote(host: dict[str, Any], router_url: str) -> None:
    verified_decision(host["app"].store, "primary", "hook-{digest}")
    out = lifecycle.promote(host["app"], slot="primary", approved_by="hook-test")
    assert out.state == TxState.COMMITTED, out.reason
    assert routed(router_url) == (200, CANDIDATE)


def drop_in_command(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The drop-in's ExecStartPost as systemd runs it (its `-` prefix only says a failure does
    not fail the router's start), with this checkout's venv for /opt/anvil/.venv and the test's
    state directory for its Environment."""
    lines = [line.strip() for line in DROP_IN.read_text().splitlines()]
    (post,) = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStartPost=")]
    argv = shlex.split(post.removeprefix("-").replace("/opt/anvil/.venv", str(VENV)))
    unit_env = dict(line.split("=", 1)[1].split("=", 1) for line in lines if line.startswith("Environment="))
    assert set(unit_env) == {"ANVIL_STATE_DIR"}
    return argv, env  # the test's env already names its own state directory


class TestSystemdDropIn:
    def test_the_exec_start_post_line_heals_the_route_after_a_restart(
        self, tmp_path: Path, stub_container: Any, runtime: Any
    ) -> None:
        smg: Proc = start_smg(workdir=tmp_path / "smg", admin_token=Keys.admin, client_token=Keys.client)
        host = loaded_host(tmp_path, stub_container, smg.url)
        hook: subprocess.Popen[str] | None = None
        try:
            promote(host, smg.url)
            repairs = reconciles(host)
            port = int(smg.url.rsplit(":", 1)[1])
            smg.kill()
            argv, env = drop_in_command(host["env"])
            restarted = time.monotonic()
            # systemd starts ExecStartPost once the router's process exists, before it listens.
            hook = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            smg = start_smg(
                workdir=tmp_path / "smg", admin_token=Keys.admin, client_token=Keys.client, port=port
            )
            seen: list[Any] = []
            healed = heal_time(smg.url, restarted, seen)
            out, err = hook.communicate(timeout=HEAL_DEADLINE_S)
            print(
                f"\nsystemd drop-in: route healed {healed:.2f} s after smg started again; answers {seen[:3]}"
            )
            assert hook.returncode == 0, out[-2000:] + err[-2000:]
            assert reconciles(host) == repairs + 1  # the hook's repair healed it, nothing else
        finally:
            if hook is not None and hook.poll() is None:
                hook.kill()
                hook.wait()
            close_host(host, runtime)
            smg.stop()


def wait_line(log: Path, text: str, proc: subprocess.Popen[bytes], *, count: int = 1) -> None:
    """Poll the watcher's log until `text` appears `count` times, within the deadline."""
    deadline = time.monotonic() + HEAL_DEADLINE_S
    while log.read_text().count(text) < count:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


SMG_IN_CONTAINER = (
    "import json,sys\n"
    "from smg.cli import main\n"
    "sys.argv=['smg']\n"
    "main(json.load(open(sys.argv[-1] if len(sys.argv)>1 else '/run/anvil/smg-argv.json')))\n"
)


@pytest.fixture
def smg_container(tmp_path: Path, docker_client: Any, stub_image_id: str) -> Iterator[dict[str, Any]]:
    """smg 1.13 in a container of the stub image (the host's /usr and this venv mounted read-only,
    host networking inside the test namespace), its keys in a 0600 argv file mounted read-only."""
    port, metrics = free_port(), free_port()
    argv = smg_argv(port=port, metrics_port=metrics, admin_token=Keys.admin, client_token=Keys.client)
    conf = tmp_path / "smg-conf"
    conf.mkdir()
    argv_file = conf / "smg-argv.json"
    fd = os.open(argv_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(argv, fh)
    ro = {"bind": "", "mode": "ro"}
    volumes = {p: {**ro, "bind": p} for p in ("/usr", "/lib", "/lib64") if Path(p).exists()}
    volumes[str(VENV)] = {**ro, "bind": str(VENV)}
    home = Path(sys.executable).resolve().parent.parent  # the interpreter the venv was made from
    volumes.setdefault(str(home), {**ro, "bind": str(home)})
    volumes[str(conf)] = {**ro, "bind": "/run/anvil"}
    name = f"anvil-test-smg-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        stub_image_id,
        [str(VENV / "bin" / "python"), "-c", SMG_IN_CONTAINER],
        name=name,
        detach=True,
        network_mode="host",
        init=True,
        volumes=volumes,
        labels={"io.anvil.role": "test"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/liveness", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        container.reload()
        assert container.status == "running", container.logs()[-2000:]
        assert time.monotonic() < deadline, "smg in its container did not answer within 30 s"
        time.sleep(0.2)
    yield {"container": container, "name": name, "url": url}
    container.remove(force=True)


class TestContainerRouterWatcher:
    def test_a_docker_restart_of_the_router_is_healed_by_the_watcher(
        self, tmp_path: Path, stub_container: Any, runtime: Any, smg_container: dict[str, Any]
    ) -> None:
        url = smg_container["url"]
        host = loaded_host(tmp_path, stub_container, url)
        log = tmp_path / "watch.log"
        watcher: subprocess.Popen[bytes] | None = None
        try:
            promote(host, url)
            with log.open("wb") as out:
                watcher = subprocess.Popen(
                    [sys.executable, str(WATCHER), "--container", smg_container["name"], "--slot", "primary"],
                    env=host["env"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            wait_line(log, "following starts", watcher)
            wait_line(log, "exit 0", watcher)  # the watcher's own first pass: the route held
            repairs = reconciles(host)
            began = time.monotonic()
            smg_container["container"].restart(timeout=5)
            started = time.monotonic()
            seen: list[Any] = []
            healed = heal_time(url, started, seen)
            print(
                f"\ncontainer watcher: route healed {healed:.2f} s after smg started again "
                f"(docker restart took {started - began:.2f} s); answers {seen[:3]}"
            )
            wait_line(log, "exit 0", watcher, count=2)
            assert reconciles(host) == repairs + 1, log.read_text()
        finally:
            if watcher is not None and watcher.poll() is None:
                watcher.terminate()
                watcher.wait(timeout=10)
            close_host(host, runtime)


class TestContainerHaproxyWatcher:
    def test_a_docker_restart_of_haproxy_is_healed_by_the_watcher(
        self, tmp_path: Path, docker_client: Any, stub_image_id: str
    ) -> None:
        """HAProxy keeps its servers' addresses and states from the Runtime API in memory: a
        `docker restart` brings it back with every server in maintenance (503 for the alias).
        The watcher's repair puts the promoted candidate back on the route."""
        from tests.integration.conftest import campaign_host
        from tests.integration.test_load_docker import variant

        with campaign_host(tmp_path / "host", "haproxy") as host:
            camp = host.camp
            config, socket_path = camp.router.extra["config"], Path(camp.router.extra["socket"])
            camp.router.stop()  # the same HAProxy, its config and socket, now run in a container
            socket_path.unlink(missing_ok=True)
            ro = {"bind": "", "mode": "ro"}
            volumes = {p: {**ro, "bind": p} for p in ("/usr", "/lib", "/lib64") if Path(p).exists()}
            volumes[str(Path(config).parent)] = {"bind": str(Path(config).parent), "mode": "rw"}
            name = f"anvil-test-haproxy-{uuid.uuid4().hex[:8]}"
            container = docker_client.containers.run(
                stub_image_id,
                ["/usr/sbin/haproxy", "-db", "-f", config],
                name=name,
                detach=True,
                network_mode="host",
                init=True,
                volumes=volumes,
                labels={"io.anvil.role": "test"},
            )
            log = tmp_path / "watch.log"
            argv = [sys.executable, str(WATCHER), "--container", name, "--slot", "primary"]
            with log.open("wb") as out:
                watcher = subprocess.Popen(
                    argv,
                    env=camp.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                wait_line(log, "following starts", watcher)
                wait_line(log, "exit 0", watcher)  # its first pass routed the incumbent again
                variant(tmp_path, "cand", [])
                loaded = host.run("load", str(tmp_path / "cand.toml"), "--slot", "primary")
                assert loaded["state"] == "committed", loaded.get("reason")
                verified_decision(host.app().store, "primary", "hook-{digest}")
                promoted = host.run("promote", "--slot", "primary", "--approved-by", "hook-test")
                assert promoted["state"] == "committed", promoted.get("reason")
                repairs = len(audit.transactions(host.app(), kind="reconcile", state="committed", limit=100))
                began = time.monotonic()
                container.restart(timeout=5)
                restarted = time.monotonic()
                seen: list[Any] = []
                deadline = time.monotonic() + HEAL_DEADLINE_S
                while True:
                    status, model = routed(camp.router.url, camp.client_token)
                    seen.append((status, model))
                    if status == 200 and model == CANDIDATE:
                        break
                    assert time.monotonic() < deadline, f"not healed in {HEAL_DEADLINE_S} s: {seen[-3:]}"
                    time.sleep(0.2)
                healed = time.monotonic() - restarted
                print(
                    f"\nhaproxy container watcher: route healed {healed:.2f} s after HAProxy started "
                    f"again (docker restart took {restarted - began:.2f} s)"
                )
                wait_line(log, "exit 0", watcher, count=2)
                after = audit.transactions(host.app(), kind="reconcile", state="committed", limit=100)
                assert len(after) == repairs + 1, log.read_text()
            finally:
                if watcher.poll() is None:
                    watcher.terminate()
                    watcher.wait(timeout=10)
