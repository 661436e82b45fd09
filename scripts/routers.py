"""Start and stop real routers (smg, HAProxy) and plain stub engines for tests and `make demo`.

Everything binds to 127.0.0.1 and uses short health intervals. Tokens never
reach a command line: smg is started through a bootstrap that reads its
argv (with the keys) from a 0600 file and deletes it at once; HAProxy gets the
client token only inside its 0600 config. Run this inside a loopback-only
network namespace (`scripts/testenv run -- ...`, or `--netns NAME`): smg must
not reach any model hub.

    python scripts/routers.py smg --port 30000            # tokens from ANVIL_ROUTER_*_TOKEN
    python scripts/routers.py haproxy --port 30080 --tier primary-local=llm.primary
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.adapters.haproxy_config import READY_URI, render_config, write_config

PYTHON = sys.executable

# Reads the full smg argv from a private file, removes the file, then runs smg in-process,
# so that /proc/<pid>/cmdline never shows a key.
_SMG_BOOTSTRAP = (
    "import json,os,sys\n"
    "p=sys.argv[1]\n"
    "argv=json.load(open(p))\n"
    "os.unlink(p)\n"
    "from smg.cli import main\n"
    "sys.argv=['smg']\n"
    "main(argv)\n"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _netns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


@dataclass
class Proc:
    """A process we started, stopped by its own PID only."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _spawn(name: str, argv: list[str], log_path: Path, url: str, **extra: str) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
        )
    return Proc(name=name, proc=proc, url=url, log_path=log_path, extra=dict(extra))


def wait_http(proc: Proc, path: str, *, timeout_s: float = 20.0, ok: Sequence[int] = (200,)) -> None:
    """Wait until `proc.url + path` answers one of `ok` (any answer if ok is empty)."""
    end = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.proc.returncode}):\n{proc.log_tail()}")
        try:
            status = httpx.get(proc.url + path, timeout=2.0).status_code
            if not ok or status in ok:
                return
            last = f"HTTP {status}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} at {proc.url}{path} not ready after {timeout_s}s: {last}")


def start_stub(
    served_model: str,
    *,
    workdir: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    netns: str | None = None,
) -> Proc:
    """The stub engine as a plain process (when no container runtime is at hand)."""
    port = port or free_port()
    argv = [
        *_netns_prefix(netns),
        PYTHON,
        "-m",
        "anvil_stub",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model",
        served_model,
        *extra_args,
    ]
    proc = _spawn(f"stub-{port}", argv, workdir / f"stub-{port}.log", f"http://127.0.0.1:{port}")
    wait_http(proc, "/v1/models", ok=())
    return proc


def exit_on_sigterm() -> None:
    """In a script's main thread: SIGTERM raises SystemExit(143), so `finally` stops its routers.

    Python's default for SIGTERM is to die at once, and smg, a process of its own, outlives
    a killed chaos run or benchmark (`timeout`, a CI job's cancel) and keeps its port.
    """
    signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def smg_argv(
    *,
    port: int,
    metrics_port: int,
    admin_token: str,
    client_token: str,
    user_token: str | None = None,
    health_interval_s: int = 1,
    health_failure_threshold: int = 1,
    health_success_threshold: int = 1,
    cb_failure_threshold: int | None = None,
    cb_timeout_s: int | None = None,
) -> list[str]:
    """smg's `launch` arguments: bound to 127.0.0.1 (router and metrics), no tokenizer, our keys."""
    keys = [f"anvil-admin:anvil admin:admin:{admin_token}"]
    if user_token:
        keys.append(f"anvil-user:anvil read-only:user:{user_token}")
    argv = [
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--disable-tokenizer-autoload",
        "--health-check-interval-secs",
        str(health_interval_s),
        "--health-failure-threshold",
        str(health_failure_threshold),
        "--health-success-threshold",
        str(health_success_threshold),
        "--health-check-timeout-secs",
        "1",
        # A worker posted while its engine is down is probed again only this often.
        "--worker-startup-check-interval",
        "1",
        # One argument: a token may begin with "-" (token_urlsafe), which argparse would read
        # as an option ("--api-key: expected one argument" once in 64 campaigns).
        f"--api-key={client_token}",
        "--control-plane-api-keys",
        *keys,
    ]
    if cb_failure_threshold is not None:
        argv += ["--cb-failure-threshold", str(cb_failure_threshold)]
    if cb_timeout_s is not None:
        argv += ["--cb-timeout-duration-secs", str(cb_timeout_s)]
    return argv


def start_smg(
    *,
    workdir: Path,
    admin_token: str,
    client_token: str,
    user_token: str | None = None,
    port: int | None = None,
    health_interval_s: int = 1,
    health_failure_threshold: int = 1,
    health_success_threshold: int = 1,
    cb_failure_threshold: int | None = None,
    cb_timeout_s: int | None = None,
    extra_args: Sequence[str] = (),
    netns: str | None = None,
) -> Proc:
    """smg (`smg_argv`) with its keys in a private argv file."""
    port = port or free_port()
    metrics_port = free_port()
    argv = smg_argv(
        port=port,
        metrics_port=metrics_port,
        admin_token=admin_token,
        client_token=client_token,
        user_token=user_token,
        health_interval_s=health_interval_s,
        health_failure_threshold=health_failure_threshold,
        health_success_threshold=health_success_threshold,
        cb_failure_threshold=cb_failure_threshold,
        cb_timeout_s=cb_timeout_s,
    )
    argv += list(extra_args)
    workdir.mkdir(parents=True, exist_ok=True)
    argv_file = workdir / f".smg-argv-{port}.json"
    fd = os.open(argv_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(argv, fh)
    cmd = [*_netns_prefix(netns), PYTHON, "-c", _SMG_BOOTSTRAP, str(argv_file)]
    proc = _spawn(
        f"smg-{port}",
        cmd,
        workdir / f"smg-{port}.log",
        f"http://127.0.0.1:{port}",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
    )
    wait_http(proc, "/liveness")
    return proc


def start_haproxy(
    *,
    workdir: Path,
    tiers: Mapping[str, tuple[str, ...]],
    client_token: str,
    port: int | None = None,
    check_inter_ms: int = 300,
    slots: int = 2,
    netns: str | None = None,
    health_path: str = "/health",
) -> Proc:
    """HAProxy in the foreground (-db) with a generated 0600 config and a 0600 admin socket.

    `health_path` is what its checks GET on each backend: `/v1/models` for an engine
    without a health route (llama.cpp), which answers 200 only once the model is loaded.
    """
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    socket_path = workdir / f"haproxy-{port}.sock"
    config_path = workdir / f"haproxy-{port}.cfg"
    text = render_config(
        tiers,
        bind=f"127.0.0.1:{port}",
        socket_path=socket_path,
        client_token=Secret(client_token, "test"),
        slots=slots,
        check_inter_ms=check_inter_ms,
        fall=1,
        rise=1,
        health_path=health_path,
    )
    write_config(config_path, text)
    cmd = [*_netns_prefix(netns), "haproxy", "-db", "-f", str(config_path)]
    proc = _spawn(
        f"haproxy-{port}",
        cmd,
        workdir / f"haproxy-{port}.log",
        f"http://127.0.0.1:{port}",
        socket=str(socket_path),
        config=str(config_path),
    )
    wait_http(proc, READY_URI, ok=())
    end = time.monotonic() + 10
    while not socket_path.exists():
        if time.monotonic() > end:
            raise RuntimeError(f"haproxy socket {socket_path} did not appear:\n{proc.log_tail()}")
        time.sleep(0.05)
    return proc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["smg", "haproxy"])
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=Path("state/routers"))
    parser.add_argument("--tier", action="append", default=[], help="TIER=ALIAS[,ALIAS] (haproxy)")
    parser.add_argument("--netns", default=None)
    args = parser.parse_args(argv)
    client = os.environ.get("ANVIL_ROUTER_CLIENT_TOKEN", "")
    if not client:
        parser.error("ANVIL_ROUTER_CLIENT_TOKEN must be set")
    if args.kind == "smg":
        admin = os.environ.get("ANVIL_ROUTER_ADMIN_TOKEN", "")
        if not admin:
            parser.error("ANVIL_ROUTER_ADMIN_TOKEN must be set")
        proc = start_smg(
            workdir=args.workdir,
            admin_token=admin,
            client_token=client,
            port=args.port,
            netns=args.netns,
        )
    else:
        tiers = {t: tuple(a.split(",")) for t, _, a in (s.partition("=") for s in args.tier)}
        proc = start_haproxy(
            workdir=args.workdir, tiers=tiers, client_token=client, port=args.port, netns=args.netns
        )
    print(json.dumps({"kind": args.kind, "pid": proc.pid, "url": proc.url, **proc.extra}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
