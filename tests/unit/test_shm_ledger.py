"""The shm ledger in the state database, and the scanner the composition root builds with it."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from anvil_ctl.adapters.shm import ShmScanner
from anvil_ctl.bootstrap import App, _shm
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.model import ShmMark
from anvil_ctl.core.ports import ShmLedger
from anvil_ctl.persistence import hosts
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.persistence.shm_ledger import StoreShmLedger
from anvil_ctl.persistence.store import Store
from anvil_ctl.persistence.verify import verify
from anvil_ctl.testing.runtime import FakeRuntime
from anvil_ctl.testing.world import FakeWorld

ENGINE = "e" * 64


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "anvil.db"


@pytest.fixture
def store(db: Path) -> Store:
    engine = make_engine(f"sqlite:///{db}", create=True)
    upgrade(engine)
    store = Store(engine)
    hosts.attach(store, "host-a", machine_id="a" * 32, boot_id="b1")
    return store


def mark(path: str = "/dev/shm/kv-1", ino: int = 11, boot: str = "b1", cid: str = ENGINE) -> ShmMark:
    return ShmMark(path=path, dev=0x2A, ino=ino, container_id=cid, boot_id=boot)


class TestShmLedgerOnTheStore:
    def test_is_a_ledger_port(self, store: Store) -> None:
        assert isinstance(StoreShmLedger(store), ShmLedger)

    def test_a_mark_is_recorded_once_per_boot_path_and_inode(self, store: Store) -> None:
        StoreShmLedger(store).remember([mark(), mark(cid="f" * 64)])
        assert StoreShmLedger(store).marks("b1") == [mark()]
        StoreShmLedger(store).remember([mark(), mark(ino=12)])
        assert StoreShmLedger(store).marks("b1") == [mark(), mark(ino=12)]

    def test_marks_are_read_per_boot(self, store: Store) -> None:
        StoreShmLedger(store).remember([mark(boot="b1"), mark(boot="b2", ino=99)])
        assert StoreShmLedger(store).marks("b2") == [mark(boot="b2", ino=99)]
        assert StoreShmLedger(store).marks("b3") == []

    def test_the_table_is_append_only_and_the_operator_view_reads_it(self, store: Store, db: Path) -> None:
        StoreShmLedger(store).remember([mark()])
        con = sqlite3.connect(db)
        try:
            assert con.execute("select path, container_id from v_shm_marks").fetchall() == [
                ("/dev/shm/kv-1", ENGINE)
            ]
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                con.execute("update shm_marks set path = 'x'")
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                con.execute("delete from shm_marks")
        finally:
            con.close()

    def test_every_new_mark_is_audited(self, store: Store) -> None:
        StoreShmLedger(store).remember([mark()])
        StoreShmLedger(store).remember([mark()])  # known: nothing written
        with store.read() as s:
            events = s.execute(text("select event from audit_journal")).scalars().all()
        assert events == ["host.registered", "shm.marked"]
        assert verify(store, full=True).ok

    def test_a_file_left_by_a_stopped_container_stays_ours_for_the_next_command(
        self, tmp_path: Path, db: Path, store: Store
    ) -> None:
        shm = tmp_path / "shm"
        shm.mkdir()
        kv = shm / "engine-buffer"
        kv.write_bytes(b"x" * 4096)
        proc = tmp_path / "proc"
        (proc / "700" / "fd").mkdir(parents=True)
        (proc / "700" / "cgroup").write_text(f"0::/system.slice/docker-{ENGINE}.scope\n")
        (proc / "700" / "maps").write_text("")
        (proc / "700" / "fd" / "3").symlink_to(kv)
        running = ShmScanner(shm, proc_root=proc, managed=lambda: {ENGINE: 700}, ledger=StoreShmLedger(store))
        assert running.residue() == []  # held: in use
        for f in (proc / "700" / "fd" / "3", proc / "700" / "cgroup", proc / "700" / "maps"):
            f.unlink()
        os.rmdir(proc / "700" / "fd")
        os.rmdir(proc / "700")
        later = Store(make_engine(f"sqlite:///{db}"))  # another process, another connection
        left = ShmScanner(shm, proc_root=proc, managed=lambda: {}, ledger=StoreShmLedger(later))
        assert [r.path for r in left.residue()] == [str(kv.resolve())]


class TestCompositionRoot:
    def test_the_real_world_scans_the_configured_directory_with_the_ledger_and_the_runtime(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "anvil.toml").write_text(
            f'[residue]\ndirectory = "{tmp_path}"\ninclude = ["nccl-*"]\nexclude = ["nccl-keep*"]\n'
        )
        settings = Settings(  # type: ignore[call-arg]
            state_dir=tmp_path / "state", config=tmp_path / "anvil.toml"
        )
        app = App(settings=settings, env={})
        upgrade(app.create_database())
        runtime = FakeRuntime(FakeWorld(tmp_path / "world.json"))
        scanner = _shm(app, runtime)
        assert isinstance(scanner, ShmScanner)
        assert scanner.directory == tmp_path.resolve()
        assert (scanner.include, scanner.exclude) == (("nccl-*",), ("nccl-keep*",))
        assert isinstance(scanner.ledger, StoreShmLedger)
        assert scanner.managed is not None and dict(scanner.managed()) == {}
