"""The state database: migrations own the schema, revisions are checked, the audit chain holds."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import check_revision, upgrade
from anvil_ctl.persistence.models import Base
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


class TestMigrations:
    def test_upgrade_of_an_empty_database_reaches_head_with_wal_and_foreign_keys(
        self, tmp_path: Path
    ) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
        before, after = upgrade(engine)
        assert before is None and after == check_revision(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL

    def test_the_orm_and_the_migrations_agree(self, tmp_path: Path) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
        upgrade(engine)
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diffs == []

    def test_a_database_at_an_unknown_revision_is_refused(self, tmp_path: Path) -> None:
        db = tmp_path / "a.db"
        engine = make_engine(f"sqlite:///{db}")
        upgrade(engine)
        con = sqlite3.connect(db)
        con.execute("UPDATE alembic_version SET version_num='9999_future'")
        con.commit()
        con.close()
        with pytest.raises(StateStoreError, match="unknown to this anvilctl"):
            check_revision(engine)
        with pytest.raises(StateStoreError, match="newer version"):
            upgrade(engine)

    def test_a_foreign_database_is_refused(self, tmp_path: Path) -> None:
        db = tmp_path / "a.db"
        sqlite3.connect(db).execute("CREATE TABLE t(x)").connection.close()
        with pytest.raises(StateStoreError, match="not an anvil state db"):
            check_revision(make_engine(f"sqlite:///{db}"))

    def test_commands_refuse_an_uninitialised_database(self, tmp_path: Path) -> None:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "anvil_ctl",
                "--state-dir",
                str(tmp_path),
                "audit",
                "transactions",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert r.returncode == 2
        assert "run `anvilctl init`" in r.stderr
        assert "Traceback" not in r.stderr


class TestCliOnANewDatabase:
    def test_init_then_audit_transactions_json_prints_an_empty_list(self, tmp_path: Path) -> None:
        base = [sys.executable, "-m", "anvil_ctl", "--state-dir", str(tmp_path / "state")]
        init = subprocess.run([*base, "init"], capture_output=True, text=True, cwd=REPO)
        assert init.returncode == 0, init.stderr
        out = subprocess.run(
            [*base, "audit", "transactions", "--json"], capture_output=True, text=True, cwd=REPO
        )
        assert out.returncode == 0 and json.loads(out.stdout) == []


class TestAuditChain:
    def _tamper(self, host: FakeHost, sql: str) -> None:
        con = sqlite3.connect(host.settings.state_dir / "anvil.db")
        # Tampering means getting past the append-only triggers first.
        con.execute("DROP TRIGGER IF EXISTS audit_journal_no_update")
        con.execute("DROP TRIGGER IF EXISTS audit_journal_no_delete")
        con.execute(sql)
        con.commit()
        con.close()

    def _verify(self, host: FakeHost) -> tuple[int, dict]:  # type: ignore[type-arg]
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "audit", "verify", "--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=host.env(),
        )
        return r.returncode, json.loads(r.stdout)

    def test_an_untouched_chain_verifies(self, fake_host: FakeHost) -> None:
        code, result = self._verify(fake_host)
        assert code == 0 and result["ok"] and result["rows"] > 5

    def test_an_edited_row_is_named(self, fake_host: FakeHost) -> None:
        self._tamper(fake_host, "UPDATE audit_journal SET payload_json='{\"x\":1}' WHERE id=3")
        code, result = self._verify(fake_host)
        assert code == 6 and not result["ok"]
        assert {"row_id": 3, "problem": "content edited: hash does not match the entry"} in result["problems"]

    def test_a_deleted_row_is_named(self, fake_host: FakeHost) -> None:
        self._tamper(fake_host, "DELETE FROM audit_journal WHERE id=4")
        code, result = self._verify(fake_host)
        assert code == 6
        assert any(p["row_id"] == 5 and "missing" in p["problem"] for p in result["problems"])

    def test_reordered_rows_are_detected(self, fake_host: FakeHost) -> None:
        self._tamper(fake_host, "UPDATE audit_journal SET id = 1000 WHERE id = 2")
        self._tamper(fake_host, "UPDATE audit_journal SET id = 2 WHERE id = 3")
        self._tamper(fake_host, "UPDATE audit_journal SET id = 3 WHERE id = 1000")
        code, result = self._verify(fake_host)
        assert code == 6
        assert any(p["row_id"] == 2 and "link broken" in p["problem"] for p in result["problems"])
