"""The state database: migrations own the schema, revisions are checked, the audit chain holds."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.persistence.current_models import Base
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.ddl import expected_triggers
from anvil_ctl.persistence.migrate import (
    SCHEMA_REVISION,
    alembic_config,
    check_revision,
    head_revision,
    upgrade,
)
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES
from tests.pgserver import execute_as_attacker
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


PARTIAL = {"ix_decisions_waived": "waiver_ids_json <> '[]'", "ix_tx_current_unresolved": "unresolved = 1"}


def create_index_sql(name: str, dialect: str) -> str:
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex

    index = next(i for t in Base.metadata.tables.values() for i in t.indexes if i.name == name)
    chosen = postgresql.dialect() if dialect == "postgresql" else sqlite.dialect()
    return str(CreateIndex(index).compile(dialect=chosen))


class TestPartialIndexes:
    """A partial index names its PostgreSQL WHERE once a PostgreSQL engine is made, so that a
    command on SQLite never loads the PostgreSQL dialect (its drivers' modules, ~45 ms)."""

    def test_a_postgresql_engine_gives_each_partial_index_its_where(self) -> None:
        engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:9/none")  # never connects
        engine.dispose()
        for name, where in PARTIAL.items():
            assert create_index_sql(name, "postgresql").endswith(f"WHERE {where}")
            assert create_index_sql(name, "sqlite").endswith(f"WHERE {where}")

    def test_models_and_a_sqlite_engine_load_no_postgresql_dialect(self, tmp_path: Path) -> None:
        child = (
            "import json, sys\n"
            "from anvil_ctl.persistence.db import make_engine\n"
            "from anvil_ctl.persistence.models import Base\n"
            f"make_engine('sqlite:///{tmp_path}/x.db', create=True).dispose()\n"
            "print(json.dumps([m for m in sys.modules if m.startswith('sqlalchemy.dialects.')]))\n"
        )
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        loaded = json.loads(r.stdout)
        assert "sqlalchemy.dialects.sqlite" in loaded
        assert not [m for m in loaded if m.startswith("sqlalchemy.dialects.postgresql")]


class TestMigrations:
    def test_upgrade_of_an_empty_database_reaches_head_with_wal_and_foreign_keys(
        self, tmp_path: Path
    ) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}", create=True)
        before, after = upgrade(engine)
        assert before is None and after == check_revision(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL

    def test_the_orm_and_the_migrations_agree(self, tmp_path: Path) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}", create=True)
        upgrade(engine)
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diffs == []

    def test_the_revision_checked_without_alembic_is_alembics_head(self, tmp_path: Path) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}", create=True)
        assert head_revision(engine) == SCHEMA_REVISION

    def test_a_database_at_an_unknown_revision_is_refused(self, tmp_path: Path) -> None:
        db = tmp_path / "a.db"
        engine = make_engine(f"sqlite:///{db}", create=True)
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
    """On both backends (`fake_host_on`)."""

    def _tamper(self, host: FakeHost, sql: str) -> None:
        # Tampering means getting past the append-only triggers first.
        execute_as_attacker(host.settings.db_url, sql)

    def _verify(self, host: FakeHost) -> tuple[int, dict]:  # type: ignore[type-arg]
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "audit", "verify", "--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=host.env(),
        )
        return r.returncode, json.loads(r.stdout)

    def test_an_untouched_chain_verifies(self, fake_host_on: FakeHost) -> None:
        code, result = self._verify(fake_host_on)
        assert code == 0 and result["ok"] and result["rows"] > 5

    def test_an_edited_row_is_named(self, fake_host_on: FakeHost) -> None:
        self._tamper(fake_host_on, "UPDATE audit_journal SET payload_json='{\"x\":1}' WHERE id=3")
        code, result = self._verify(fake_host_on)
        assert code == 6 and not result["ok"]
        assert {"row_id": 3, "problem": "content edited: hash does not match the entry"} in result["problems"]

    def test_a_deleted_row_is_named(self, fake_host_on: FakeHost) -> None:
        self._tamper(fake_host_on, "DELETE FROM audit_journal WHERE id=4")
        code, result = self._verify(fake_host_on)
        assert code == 6
        assert any(p["row_id"] == 5 and "missing" in p["problem"] for p in result["problems"])

    def test_reordered_rows_are_detected(self, fake_host_on: FakeHost) -> None:
        self._tamper(fake_host_on, "UPDATE audit_journal SET id = 1000 WHERE id = 2")
        self._tamper(fake_host_on, "UPDATE audit_journal SET id = 2 WHERE id = 3")
        self._tamper(fake_host_on, "UPDATE audit_journal SET id = 3 WHERE id = 1000")
        code, result = self._verify(fake_host_on)
        assert code == 6
        assert any(p["row_id"] == 2 and "link broken" in p["problem"] for p in result["problems"])


class TestBaseline:
    """One revision makes the whole schema; databases of development versions before it are refused."""

    def _schema(self, db: Path) -> list[tuple[str, str, str]]:
        con = sqlite3.connect(db)
        rows = con.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE tbl_name <> 'alembic_version' ORDER BY name"
        )
        schema = [(t, n, s or "") for t, n, s in rows]
        con.close()
        return schema

    def test_every_history_table_and_the_journal_refuse_update_delete_and_replace(
        self, tmp_path: Path
    ) -> None:
        db = tmp_path / "anvil.db"
        upgrade(make_engine(f"sqlite:///{db}", create=True))
        triggers = {n for t, n, _ in self._schema(db) if t == "trigger"}
        assert triggers == set(expected_triggers("sqlite", APPEND_ONLY_TABLES))

    def test_down_and_up_again_makes_the_same_schema(self, tmp_path: Path) -> None:
        db = tmp_path / "anvil.db"
        engine = make_engine(f"sqlite:///{db}", create=True)
        upgrade(engine)
        schema = self._schema(db)
        command.downgrade(alembic_config(engine), "base")
        assert self._schema(db) == []
        command.upgrade(alembic_config(engine), "head")
        assert self._schema(db) == schema

    @pytest.mark.parametrize("revision", ["0001", "0021"])
    def test_a_database_of_a_revision_before_the_baseline_is_refused_by_name(
        self, tmp_path: Path, revision: str
    ) -> None:
        db = tmp_path / "anvil.db"
        engine = make_engine(f"sqlite:///{db}", create=True)
        upgrade(engine)
        con = sqlite3.connect(db)
        con.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        con.commit()
        con.close()
        for attempt in (check_revision, upgrade):
            with pytest.raises(
                StateStoreError, match=f"revision {revision}, written by a development version"
            ):
                attempt(engine)
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "--state-dir", str(tmp_path), "audit", "transactions"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert r.returncode == 2 and "anvilctl init" in r.stderr, (r.returncode, r.stderr)


class TestInit:
    def test_a_new_database_sets_a_leftover_head_file_aside(self, tmp_path: Path) -> None:
        (tmp_path / "anvil.db.head").write_text(json.dumps({"seq": 500, "hash": "a" * 64}))
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "--state-dir", str(tmp_path), "init", "--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stderr
        stale = Path(json.loads(r.stdout)["stale_head_file"])
        assert json.loads(stale.read_text())["seq"] == 500
        # the new chain's one entry: init registered this host (it pins no stale head)
        assert json.loads((tmp_path / "anvil.db.head").read_text())["seq"] == 1
