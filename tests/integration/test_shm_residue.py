"""Residue means ours, on the real Docker Engine and the host's real /dev/shm.

Throughout, /dev/shm holds a foreign 4 KiB file and a `PostgreSQL.<n>` segment held
open by a host process outside any container; neither may ever fail `recheck`'s
residue assertion or be removed by `unload --remove-residue`. A managed stub
container (ipc=host, so it shares the host's /dev/shm, as engines are run) holds a
file while it runs, which is in use, not residue; once the container stopped, the
file it left is residue until it is removed. Every file this test makes is removed
by its exact path in a finally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import recheck, serves, transactions
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.errors import NotFound
from anvil_ctl.core.model import ContainerSpec
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.observe import observe
from anvil_ctl.persistence.migrate import upgrade
from tests.integration.conftest import find_free_port, wait_healthy
from tests.integration.hosts import INCUMBENT, sim_host_toml

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm")  # the real host directory is the point of this test
HOLD_OPEN = """
import sys
fh = open(sys.argv[1], "rb")
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def foreign_files() -> Iterator[dict[str, Path]]:
    """A foreign file and a PostgreSQL-style segment held by a host process, both in /dev/shm."""
    tag = uuid.uuid4().hex[:10]
    foreign = SHM / f"anvil-it-foreign-{tag}"
    pg = SHM / f"PostgreSQL.{int(tag, 16) % 4_000_000_000}"
    holder: subprocess.Popen[str] | None = None
    try:
        foreign.write_bytes(b"f" * 4096)
        pg.write_bytes(b"p" * 65536)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_OPEN, str(pg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield {"foreign": foreign, "pg": pg}
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(timeout=10)
            for stream in (holder.stdin, holder.stdout):
                if stream is not None:
                    stream.close()
        foreign.unlink(missing_ok=True)
        pg.unlink(missing_ok=True)


@pytest.fixture
def host(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[dict[str, Any]]:
    (tmp_path / "anvil.toml").write_text(sim_host_toml())
    settings = Settings(  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        config=tmp_path / "anvil.toml",
        recipes_dir=tmp_path,
        backend="real",
        gpu="simulated",
    )
    app = App(settings=settings, env={})
    upgrade(app.create_database())
    inc = stub_container(
        served_model=INCUMBENT,
        port=8001,
        labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"},
        extra_args=["--max-model-len", "524288"],
    )
    out = transactions.adopt(app, slot="primary", container_id=inc.id, context_tokens=524288)
    assert out.state == TxState.COMMITTED, out.reason
    yield {"app": app, "runtime": runtime}
    app.close()


@pytest.fixture
def leaker(stub_spec: Callable[..., ContainerSpec], runtime: Any) -> Iterator[Callable[[str], str]]:
    """Start a managed stub candidate sharing the host's /dev/shm that holds (and leaves) a file."""
    created: list[str] = []

    def start(name: str) -> str:
        port = find_free_port()
        spec = stub_spec(
            served_model="leaky-candidate",
            port=port,
            extra_args=("--shm-file", name),
            labels={"io.anvil.slot": "primary", "io.anvil.role": "candidate"},
        )
        cid: str = runtime.create(dataclasses.replace(spec, ipc_mode="host"))
        created.append(cid)
        runtime.start(cid)
        wait_healthy(f"http://127.0.0.1:{port}", cid, runtime)
        return cid

    yield start
    for cid in created:
        with contextlib.suppress(NotFound):
            runtime.remove(cid, force=True)


def residue_check(app: App) -> dict[str, Any]:
    result = recheck.recheck(app, "primary")
    (found,) = [a for a in result.assertions if a["name"] == "shm_residue_zero"]
    return found


def marks(app: App) -> list[tuple[str, str]]:
    with app.store.read() as s:
        return [(r[0], r[1]) for r in s.execute(text("select path, container_id from v_shm_marks"))]


class TestResidueMeansOurs:
    def test_foreign_files_never_count_and_a_file_a_stub_left_counts_until_removed(
        self, host: dict[str, Any], foreign_files: dict[str, Path], leaker: Callable[[str], str]
    ) -> None:
        app, rt = host["app"], host["runtime"]
        left = SHM / f"anvil-it-left-{uuid.uuid4().hex[:10]}"  # no engine's name: known by the ledger only
        try:
            assert residue_check(app) == {"name": "shm_residue_zero", "passed": True, "observed": []}

            cid = leaker(left.name)
            assert left.exists(), "the stub shares the host's /dev/shm (ipc=host)"
            assert residue_check(app)["passed"] is True  # held by the running engine: in use
            assert (str(left), cid) in marks(app)  # seen held by a managed container, remembered

            rt.stop(cid, 5)
            assert left.exists()
            assert residue_check(app) == {
                "name": "shm_residue_zero",
                "passed": False,
                "observed": [str(left)],
            }
            assert observe(app.world(), ["primary"]).body["shm_residue"] == [str(left)]

            out = serves.unload(app, cid, yes=True, remove_residue=True)
            assert out.state == TxState.COMMITTED, out.reason
            report = out.results["remove-residue"]
            mentioned = set(report["removed"]) | {k["path"] for k in report["kept"]}
            assert mentioned == {str(left)}  # files not ours are not even considered
            if left.exists():
                # Some sandboxes deny even root /proc/1/maps: removal then refuses, as it must.
                assert report["kept"] == [{"path": str(left), "why": report["kept"][0]["why"]}]
                assert report["kept"][0]["why"].startswith("holders unknown")
                left.unlink()
            assert residue_check(app) == {"name": "shm_residue_zero", "passed": True, "observed": []}
            assert foreign_files["foreign"].exists() and foreign_files["pg"].exists()
        finally:
            left.unlink(missing_ok=True)
