"""The PostgreSQL server the tests use: the one `scripts/testenv` starts, named by
ANVIL_TEST_PG_URL (a superuser URL over the server's unix socket).

Each test gets a database of its own (`PgServer.database()`), made from a template
migrated once per session, and dropped at teardown. Without the variable the
PostgreSQL cases are skipped, unless ANVIL_REQUIRE_POSTGRES=1 or
ANVIL_REQUIRE_INTEGRATION=1 (as `make test` sets), in which case they fail: the
suite must not go green on SQLite alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

URL_VAR = "ANVIL_TEST_PG_URL"


def required() -> bool:
    return "1" in (os.environ.get("ANVIL_REQUIRE_POSTGRES"), os.environ.get("ANVIL_REQUIRE_INTEGRATION"))


def skip_or_fail() -> None:
    reason = f"needs a PostgreSQL server ({URL_VAR} unset); scripts/testenv starts one"
    if required():
        pytest.fail(reason + " [ANVIL_REQUIRE_POSTGRES/ANVIL_REQUIRE_INTEGRATION=1]", pytrace=False)
    pytest.skip(reason)


@dataclass
class PgServer:
    """A server we may create databases and roles on (as its superuser)."""

    admin_url: URL
    template: str | None = None
    made: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls) -> PgServer | None:
        url = os.environ.get(URL_VAR)
        return cls(make_url(url)) if url else None

    @contextmanager
    def admin(self, database: str = "postgres") -> Iterator[Connection]:
        engine = create_engine(
            self.admin_url.set(database=database), poolclass=NullPool, isolation_level="AUTOCOMMIT"
        )
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()

    def url(self, database: str, *, user: str | None = None, password: str | None = None) -> URL:
        url = self.admin_url.set(database=database)
        if user is not None:
            url = url.set(username=user, password=password)
        return url

    def url_str(self, database: str, *, user: str | None = None, password: str | None = None) -> str:
        return self.url(database, user=user, password=password).render_as_string(hide_password=False)

    def tcp_url(self, database: str, *, user: str, password: str) -> URL:
        """The same server over 127.0.0.1:5432 (inside the test environment's namespace)."""
        return URL.create(
            "postgresql+psycopg",
            username=user,
            password=password,
            host="127.0.0.1",
            port=5432,
            database=database,
        )

    def role(self, name: str, password: str) -> None:
        """A login role with this password (dropped with `cleanup`)."""
        with self.admin() as conn:
            conn.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
            # a utility statement takes no parameters: a literal, its quotes doubled
            # (and SQLAlchemy hands the driver an empty parameter dict, so % is doubled)
            quoted = password.replace("'", "''").replace("%", "%%")
            conn.exec_driver_sql(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{quoted}'")
        self.roles.append(name)

    def _template(self) -> str:
        if self.template is None:
            from anvil_ctl.persistence.db import make_engine
            from anvil_ctl.persistence.migrate import upgrade

            name = f"anvil_tpl_{uuid.uuid4().hex[:10]}"
            with self.admin() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            engine = make_engine(self.url_str(name))
            try:
                upgrade(engine)
            finally:
                engine.dispose()
            self.template = name
            self.made.append(name)
        return self.template

    def database(self, *, migrated: bool = True, owner: str | None = None) -> str:
        """A new database's name: at the schema's head (no history yet), or empty."""
        name = f"anvil_t_{uuid.uuid4().hex[:12]}"
        template = f' TEMPLATE "{self._template()}"' if migrated else ""
        owned = f' OWNER "{owner}"' if owner else ""
        with self.admin() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{template}{owned}'))
        self.made.append(name)
        return name

    def drop(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def cleanup(self) -> None:
        for name in reversed(self.made):
            self.drop(name)
        self.made.clear()
        with self.admin() as conn:
            for role in self.roles:
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        self.roles.clear()


def pg_session_server() -> Iterator[PgServer | None]:
    server = PgServer.from_env()
    yield server
    if server is not None:
        server.cleanup()


def execute_as_attacker(db_url: str, *statements: str, past_triggers: bool = True) -> None:
    """Run `statements` on the state database as someone with its file or its owner role; with
    `past_triggers`, past the append-only triggers: sqlite3 with every trigger dropped, or a
    PostgreSQL superuser with `session_replication_role = replica` (triggers do not fire)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        import sqlite3

        con = sqlite3.connect(str(url.database))
        try:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
            for name in names if past_triggers else []:
                con.execute(f"DROP TRIGGER {name}")
            for sql in statements:
                con.execute(sql)
            con.commit()
        finally:
            con.close()
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            if past_triggers:
                conn.execute(text("SET LOCAL session_replication_role = replica"))
            for sql in statements:
                conn.exec_driver_sql(sql.replace("%", "%%"))
    finally:
        engine.dispose()


def table_text(db_url: str) -> str:
    """Every row of every table of the database's schema, as PostgreSQL prints a row (a
    bytea column as \\x and hex): what a search for a secret in the database reads."""
    engine = create_engine(make_url(db_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            tables = conn.execute(
                text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1"
                )
            ).scalars()
            return "\n".join(
                row
                for name in list(tables)
                for row in conn.execute(text(f'SELECT t::text FROM "{name}" t')).scalars()
            )
    finally:
        engine.dispose()
