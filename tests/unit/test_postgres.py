"""PostgreSQL, a real server (the one `scripts/testenv` starts): what only this backend must show.

- Migrations from an empty database reach head, and the ORM agrees with them there.
- Append-only for every statement: as the application role (`init --print-grants`),
  UPDATE, DELETE and TRUNCATE are refused on every history table, and that role still
  runs a whole rollback; as the schema's owner the triggers refuse them too (TRUNCATE by a
  statement-level trigger), and the chain then verifies with every row still there; a
  row edited past the triggers is named by `audit verify --full`.
- Safe URLs: a password holding `% @ / :` connects over TCP and over a unix socket
  given as `?host=/path`; it appears nowhere in any output, error or `--debug` log.

The behaviours both backends share run parametrized over both elsewhere (`backend` in
tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.grants import app_grants
from anvil_ctl.persistence.migrate import SCHEMA_REVISION, check_revision, upgrade
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES, Base
from tests.pgserver import PgServer, skip_or_fail
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.test_tamper import edit_column, populate

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "p%w@r/d:x%41"  # every URL delimiter, and a %-escape that must not be decoded


@pytest.fixture
def server(pg_server: PgServer | None) -> PgServer:
    if pg_server is None:
        skip_or_fail()
    assert pg_server is not None
    return pg_server


def _anvilctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


class TestMigrations:
    def test_an_empty_database_is_upgraded_to_head(self, pg_database: object, server: PgServer) -> None:
        name = server.database(migrated=False)
        engine = make_engine(server.url_str(name))
        try:
            with pytest.raises(Exception, match="not initialised"):
                check_revision(engine)
            before, after = upgrade(engine)
            assert (before, after) == (None, SCHEMA_REVISION) and check_revision(engine) == SCHEMA_REVISION
            with engine.connect() as conn:
                diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
                triggers = {
                    r[0]
                    for r in conn.execute(
                        text(
                            "SELECT tgname FROM pg_trigger "
                            "WHERE NOT tgisinternal AND tgname LIKE '%_no_truncate'"
                        )
                    )
                }
        finally:
            engine.dispose()
        assert diffs == []
        assert triggers == {f"{t}_no_truncate" for t in APPEND_ONLY_TABLES}


@pytest.fixture
def populated(tmp_path: Path, pg_database: object, server: PgServer) -> tuple[FakeHost, str]:
    """A fake host on a new PostgreSQL database with two rows in every history table; and
    the database's name."""
    name = server.database()
    host = make_fake_host(tmp_path, state_db=server.url_str(name))
    populate(host)
    return host, name


class TestAppendOnlyForEveryStatement:
    def test_the_application_role_may_only_insert_and_select_history(
        self, populated: tuple[FakeHost, str], server: PgServer
    ) -> None:
        host, name = populated
        role = f"anvil_app_{uuid.uuid4().hex[:8]}"
        server.role(role, PASSWORD)
        with server.admin(name) as conn:
            for statement in app_grants(owner="postgres", app=role):
                conn.execute(text(statement))
        app_url = server.url(name, user=role, password=PASSWORD)
        engine = create_engine(app_url, poolclass=NullPool)
        refused: dict[str, list[str]] = {}
        try:
            for table in APPEND_ONLY_TABLES:
                column = edit_column(table) if table != "audit_journal" else "event"
                for sql in (
                    f"UPDATE {table} SET {column} = {column}",
                    f"DELETE FROM {table}",
                    f"TRUNCATE {table} CASCADE",
                ):
                    with pytest.raises(DBAPIError) as err, engine.begin() as conn:
                        conn.execute(text(sql))
                    assert "permission denied" in str(err.value.orig), sql
                    refused.setdefault(table, []).append(sql.split()[0])
                with engine.connect() as conn:
                    assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() >= 2, table
        finally:
            engine.dispose()
        assert sorted(refused) == sorted(APPEND_ONLY_TABLES)
        assert all(v == ["UPDATE", "DELETE", "TRUNCATE"] for v in refused.values())
        # ... and that role is all a mutating command needs
        as_app = host.settings.model_copy(update={"state_db": app_url.render_as_string(hide_password=False)})
        app = App(settings=as_app, env={})
        out = lifecycle.rollback(app, slot="primary")  # the incumbent back, the candidate stopped
        assert out.state.value == "committed", out.reason
        report = audit.verify(App(settings=as_app, env={}), full=True)
        assert report["ok"] and report["projection_differs"] == [], report

    def test_as_the_owner_the_triggers_refuse_update_delete_and_truncate(
        self, populated: tuple[FakeHost, str], server: PgServer
    ) -> None:
        host, name = populated
        before = audit.verify(host.app(), full=True)
        assert before["ok"]
        messages: dict[str, str] = {}
        with server.admin(name) as conn:
            for table in APPEND_ONLY_TABLES:
                column = edit_column(table) if table != "audit_journal" else "event"
                for sql in (
                    f"UPDATE {table} SET {column} = {column}",
                    f"DELETE FROM {table}",
                    f"TRUNCATE {table} CASCADE",
                ):
                    with pytest.raises(DBAPIError) as err:
                        conn.execute(text(sql))
                    messages[sql] = str(err.value.orig).splitlines()[0]
            counts = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in APPEND_ONLY_TABLES
            }
        assert all(m.endswith("is append-only") for m in messages.values()), messages
        assert len(messages) == 3 * len(APPEND_ONLY_TABLES)
        assert min(counts.values()) >= 2, counts
        after = audit.verify(host.app(), full=True)
        assert after["ok"] and after["rows"] >= before["rows"], after  # (+ the first verify's checkpoint)

    def test_a_row_edited_past_the_triggers_is_named(
        self, populated: tuple[FakeHost, str], server: PgServer
    ) -> None:
        host, name = populated
        with server.admin(name) as conn:
            conn.execute(text("SET session_replication_role = replica"))  # triggers off: the owner can
            conn.execute(text("UPDATE decisions SET outcome = 'verified' WHERE id = 'dec-1'"))
        report = audit.verify(host.app(), full=True)
        assert not report["ok"]
        assert any(p.get("table") == "decisions" and p.get("key") == "dec-1" for p in report["problems"]), (
            report
        )


class TestSafeUrls:
    """A password with every URL delimiter, percent-encoded in the URL as an operator writes it."""

    @pytest.fixture
    def owner(self, server: PgServer) -> tuple[str, str]:
        role = f"anvil_owner_{uuid.uuid4().hex[:8]}"
        server.role(role, PASSWORD)
        return role, server.database(migrated=False, owner=role)

    def _urls(self, server: PgServer, role: str, database: str) -> dict[str, str]:
        socket_dir = server.admin_url.query["host"]
        assert isinstance(socket_dir, str)
        pw, encoded = quote(PASSWORD, safe=""), quote(socket_dir, safe="")
        return {
            "tcp": f"postgresql+psycopg://{role}:{pw}@127.0.0.1:5432/{database}",
            "socket": f"postgresql+psycopg://{role}:{pw}@/{database}?host={socket_dir}",
            "socket-encoded": f"postgresql+psycopg://{role}:{pw}@/{database}?host={encoded}",
        }

    def _leaks(self, r: subprocess.CompletedProcess[str]) -> list[str]:
        out = r.stdout + r.stderr
        return [form for form in (PASSWORD, quote(PASSWORD, safe=""), "p%w@r") if form in out]

    @pytest.mark.parametrize("way", ["tcp", "socket", "socket-encoded"])
    def test_the_password_connects_and_is_never_printed(
        self, way: str, owner: tuple[str, str], server: PgServer, tmp_path: Path
    ) -> None:
        role, database = owner
        url = self._urls(server, role, database)[way]
        env = {
            "PATH": "/usr/bin:/bin",
            "ANVIL_STATE_DIR": str(tmp_path),
            "ANVIL_CONFIG": str(tmp_path / "none"),
        }
        runs = {
            "init": _anvilctl("--state-db", url, "--debug", "--json", "init", env=env),
            "verify": _anvilctl("--debug", "audit", "verify", "--json", env={**env, "ANVIL_STATE_DB": url}),
            # no Docker nor host config here: status says what it cannot reach (exit 7 or 2)
            "status": _anvilctl("--state-db", url, "status", env=env),
        }
        assert runs["init"].returncode == 0, runs["init"].stderr
        assert json.loads(runs["init"].stdout)["db"].startswith(f"postgresql+psycopg://{role}:***@")
        assert runs["verify"].returncode == 0 and json.loads(runs["verify"].stdout)["ok"], runs[
            "verify"
        ].stderr
        assert runs["status"].returncode == 7 and "Docker" in runs["status"].stderr, runs["status"]
        for what, r in runs.items():
            assert self._leaks(r) == [], (what, r.stdout, r.stderr)

    @pytest.mark.parametrize("way", ["tcp", "socket"])
    def test_a_wrong_password_is_refused_without_printing_either(
        self, way: str, owner: tuple[str, str], server: PgServer, tmp_path: Path
    ) -> None:
        role, database = owner
        url = self._urls(server, role, database)[way].replace(
            quote(PASSWORD, safe=""), quote("x%@/:y", safe="")
        )
        env = {"PATH": "/usr/bin:/bin", "ANVIL_STATE_DIR": str(tmp_path), "ANVIL_STATE_DB": url}
        for args in (("init",), ("audit", "verify"), ("--debug", "audit", "verify"), ("--debug", "init")):
            r = _anvilctl(*args, env=env)
            # exit 7 with or without --debug (which adds the traceback, password masked in it)
            assert r.returncode == 7, (args, r.returncode, r.stderr)
            assert ("Traceback" in r.stderr) == (args[0] == "--debug"), r.stderr
            assert "password authentication failed" in r.stderr, r.stderr
            assert "x%@/:y" not in r.stdout + r.stderr and quote("x%@/:y", safe="") not in r.stdout + r.stderr
            assert ":***@" in r.stderr, r.stderr  # the URL is named, its password masked


class TestPrintGrants:
    """`init --print-grants` needs no server and touches nothing; the statements it prints for
    the application role are the ones the tests above run (`app_grants`)."""

    def test_it_prints_insert_and_select_on_history_and_nothing_more(self, tmp_path: Path) -> None:
        env = {"PATH": "/usr/bin:/bin", "ANVIL_STATE_DIR": str(tmp_path / "state")}
        r = _anvilctl("init", "--print-grants", "--app-role", "app_x", "--owner-role", "own_x", env=env)
        assert r.returncode == 0, r.stderr
        assert not (tmp_path / "state").exists()  # nothing created
        for statement in app_grants(owner="own_x", app="app_x"):
            assert statement + ";" in r.stdout
        history = next(line for line in r.stdout.splitlines() if line.startswith("GRANT INSERT ON "))
        assert sorted(
            history.removeprefix("GRANT INSERT ON ").removesuffix(" TO app_x;").split(", ")
        ) == sorted(APPEND_ONLY_TABLES)
        rewrites = [
            ln for ln in r.stdout.splitlines() if "UPDATE" in ln or "DELETE" in ln or "TRUNCATE" in ln
        ]
        assert all(t not in ln for ln in rewrites for t in APPEND_ONLY_TABLES), rewrites
        assert "CREATE DATABASE anvil OWNER own_x;" in r.stdout

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--app-role", "App;drop"), "--app-role: expected a PostgreSQL name"),
            (("--owner-role", "x", "--app-role", "x"), "--app-role: must differ"),
            (("--database", "a b"), "database: expected a PostgreSQL name"),
        ],
    )
    def test_a_name_that_would_need_quoting_is_refused(
        self, args: tuple[str, ...], message: str, tmp_path: Path
    ) -> None:
        r = _anvilctl(
            "init", "--print-grants", *args, env={"PATH": "/usr/bin:/bin", "ANVIL_STATE_DIR": str(tmp_path)}
        )
        assert r.returncode == 2 and message in r.stderr and r.stdout == "", r.stderr
