"""A second test environment beside the one the tests run in: another host of a fleet.

`scripts/testenv up` run from inside the first env starts a second network namespace with
a dockerd of its own (its stub image loaded; no PostgreSQL server of its own, no llama.cpp
image): `start()` begins it in the background, `SecondEnv.wait()` waits for it to answer.
The first env's DIR/nested records it, so the first env's teardown stops it (by PID) even
where the test process died before its own `down`.

Its commands run inside it through `scripts/testenv exec DIR -- CMD` (`SecondEnv.prefix`:
its namespace, its DOCKER_HOST); what the test does there in-process (start a router, talk
to it) runs in a thread moved into its namespace for the time being (`in_netns`). Its
PostgreSQL client reaches the first env's server through that server's unix socket: a path,
the same from either namespace.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTENV = REPO / "scripts" / "testenv"
UP_TIMEOUT_S = 120.0
CLONE_NEWNET = 0x40000000


def _parse_env(text: str) -> dict[str, str]:
    """`export K=V` lines as DIR/env writes them (a value maybe in single quotes)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = value.strip("'")
    return out


@dataclass
class Starting:
    """`scripts/testenv up` under way; its log (stderr) in `log`."""

    proc: subprocess.Popen[str]
    log: Path

    def wait(self) -> SecondEnv:
        try:
            out, _ = self.proc.communicate(timeout=UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise RuntimeError(
                f"scripts/testenv up not up in {UP_TIMEOUT_S}s:\n{self.log.read_text()}"
            ) from None
        if self.proc.returncode != 0 or not out.strip():
            raise RuntimeError(f"scripts/testenv up exited {self.proc.returncode}:\n{self.log.read_text()}")
        root = Path(out.strip().splitlines()[-1])
        return SecondEnv(root, _parse_env((root / "env").read_text()))

    def abandon(self) -> None:
        """The test failed before `wait`: let `up` finish, then take its env down."""
        try:
            env = self.wait()
        except RuntimeError:
            return  # a failed `up` tore itself down; a hung one goes with the first env
        env.down()


def start(log: Path) -> Starting:
    """Begin `scripts/testenv up` for a second env (from inside the first: nested there)."""
    env = os.environ | {"ANVIL_TESTENV_POSTGRES": "0", "ANVIL_TESTENV_LLAMA": "0"}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [str(TESTENV), "up"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=fh,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    return Starting(proc, log)


@dataclass
class SecondEnv:
    root: Path
    env: dict[str, str]
    """What its DIR/env exports: DOCKER_HOST, ANVIL_TESTENV_NETNS, ANVIL_STUB_IMAGE_ID, ..."""

    @property
    def netns(self) -> str:
        return self.env["ANVIL_TESTENV_NETNS"]

    @property
    def docker_host(self) -> str:
        return self.env["DOCKER_HOST"]

    @property
    def prefix(self) -> list[str]:
        """Put before a command to run it inside this env."""
        return [str(TESTENV), "exec", str(self.root), "--"]

    def down(self) -> None:
        r = subprocess.run(
            [str(TESTENV), "down", str(self.root)], capture_output=True, text=True, timeout=120, check=False
        )
        if r.returncode != 0 or self.root.exists():
            raise RuntimeError(f"scripts/testenv down {self.root} exited {r.returncode}:\n{r.stderr}")


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """This thread (and every process it starts) in network namespace `name` for the block;
    back in its own after. Other threads stay where they are (a namespace is per thread)."""
    with open("/proc/thread-self/ns/net", "rb") as own, open(f"/var/run/netns/{name}", "rb") as there:
        _setns(there.fileno())
        try:
            yield
        finally:
            _setns(own.fileno())
