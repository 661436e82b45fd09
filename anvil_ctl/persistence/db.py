"""Database engines: SQLite with WAL, foreign keys, synchronous=FULL and a busy timeout.

Writes begin IMMEDIATE so two writers never both append after the chain's tail; reads
(`reader`) begin DEFERRED and never wait for a writer. `translated` is the one edge where
database errors become ours: `Unavailable` (exit 7) or `StateStoreError` (exit 2).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, QueuePool

from anvil_ctl.core.errors import AnvilError, ConfigError, StateStoreError, Unavailable

__all__ = ["Engine", "make_engine", "reader", "translated"]  # Engine: the handle callers hold

READ_ONLY = "anvil_read_only"
"""Execution option of the engine `reader()` returns: its transactions begin DEFERRED."""

BUSY_MS = "anvil_busy_ms"
"""Execution option: how long this engine's write transactions wait for a lock (best-effort
writes, such as a verify checkpoint, wait less than the default)."""

READ_BUSY_MS = 1_000
"""How long a read waits for a lock before the command exits 7 (WAL readers rarely wait)."""

WRITE_BUSY_MS = 3_000
"""How long a write waits for another writer; our own write transactions last milliseconds."""


def make_engine(url: str, *, create: bool = False, keep_connection: bool = False) -> Engine:
    """An engine for `url`; ConfigError for a URL that is none, StateStoreError for a missing or
    irregular SQLite file (unless `create`, which makes it). `keep_connection`: a command's one
    SQLite connection lives until `dispose()`, so no write pays for closing (checkpointing) it."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            "state database URL: not a database URL; expected sqlite:///PATH or postgresql://USER@HOST/DB",
            field="state_db",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_file(parsed.database, create=create)
        engine = create_engine(
            parsed,
            # Kept: a pool keeps the connection a command made (one per thread at a time).
            poolclass=QueuePool if keep_connection else NullPool,
            connect_args={
                "timeout": READ_BUSY_MS / 1000,
                "isolation_level": None,
                "check_same_thread": False,  # a pool hands a connection to one thread at a time
            },
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={READ_BUSY_MS}")
            # WAL is a property of the file, set once: an empty file (not yet a database) is left
            # as it is, so that a read-only command never writes a header into it; `init`
            # (create) sets it at once, as its connection lives on to create the schema.
            if create or cur.execute("PRAGMA page_count").fetchone()[0]:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            options = conn.get_execution_options()
            busy = READ_BUSY_MS if options.get(READ_ONLY) else int(options.get(BUSY_MS, WRITE_BUSY_MS))
            conn.exec_driver_sql(f"PRAGMA busy_timeout={busy}")
            conn.exec_driver_sql("BEGIN" if options.get(READ_ONLY) else "BEGIN IMMEDIATE")

        return engine
    try:
        engine = create_engine(parsed, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise ConfigError(
            f"state database URL {parsed.render_as_string(hide_password=True)}: {exc}; "
            "expected sqlite:///PATH or postgresql://USER@HOST/DB",
            field="state_db",
        ) from None
    # The models' partial indexes name their PostgreSQL WHERE only once a PostgreSQL engine
    # exists (`models.partial_index`): SQLite never loads that dialect.
    import anvil_ctl.persistence.current_models  # noqa: F401  (its tables join the metadata)
    from anvil_ctl.persistence.models import Base, add_postgresql_options

    add_postgresql_options(Base.metadata)
    return engine


def reader(engine: Engine) -> Engine:
    """The same database for reading: transactions that never take the write lock."""
    return engine.execution_options(**{READ_ONLY: True})


def where(engine: Engine) -> str:
    """The database as a message names it: the SQLite file, or the URL without its password."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return url.render_as_string(hide_password=True)


def _check_sqlite_file(database: str | None, *, create: bool) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        why = " does not exist; run `anvilctl init` to create it"
        if create:
            why = "" if path.parent.is_dir() else f": directory {path.parent} does not exist"
    except NotADirectoryError:
        why = ": a parent of it is not a directory"
    except OSError as exc:  # ELOOP, EACCES on a parent
        why = f": {exc.strerror}"
    else:
        kind = " is a directory" if stat.S_ISDIR(mode) else " is not a regular file"
        why = "" if stat.S_ISREG(mode) else f"{kind}; expected an SQLite database file"
    if why:
        raise StateStoreError(f"state database {path}{why}", path=str(path))


@contextmanager
def translated(engine: Engine) -> Iterator[None]:
    """Database errors raised inside become Unavailable or StateStoreError (see the module doc)."""
    try:
        yield
    except (DBAPIError, sqlite3.Error) as exc:
        ours = database_error(engine, exc)
        if ours is None:
            raise
        raise ours from exc


_UNAVAILABLE = {
    "SQLITE_BUSY": "is locked by another process (busy); nothing was written, try again",
    "SQLITE_LOCKED": "is locked by another process (busy); nothing was written, try again",
    "SQLITE_READONLY": "is read-only (file, directory or file system); nothing was written",
    "SQLITE_FULL": "cannot grow: the disk is full; nothing was written",
    "SQLITE_IOERR": "cannot be written or read: disk I/O error; nothing was written",
    "SQLITE_CANTOPEN": "cannot be opened (permissions, or its -wal/-shm files cannot be created)",
    "SQLITE_PERM": "cannot be opened: permission denied",
}
_DAMAGED = {
    "SQLITE_NOTADB": "is not an SQLite database",
    "SQLITE_CORRUPT": "is damaged (database disk image is malformed)",
}


def database_error(engine: Engine, exc: BaseException) -> AnvilError | None:
    """Our error for a database failure, or None when it is not the database's state (a bug)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    name = str(getattr(orig, "sqlite_errorname", ""))
    family = "_".join(name.split("_")[:2])  # SQLITE_BUSY of SQLITE_BUSY_SNAPSHOT
    db = where(engine)
    if family == "SQLITE_CANTOPEN" and not os.access(Path(db).parent, os.W_OK):
        family = "SQLITE_READONLY"  # a read-only directory: the -wal/-shm files cannot be made
    if family in _UNAVAILABLE:
        return Unavailable(
            f"state database {db} {_UNAVAILABLE[family]}", dependency="database", sqlite_error=name
        )
    if family in _DAMAGED:
        return StateStoreError(f"state database {db} {_DAMAGED[family]}", sqlite_error=name)
    if isinstance(orig, sqlite3.OperationalError) and "disk" in str(orig):
        return Unavailable(f"state database {db}: {orig}", dependency="database")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return Unavailable(f"state database {db}: the connection was lost", dependency="database")
    if engine.url.get_backend_name() != "sqlite" and type(exc).__name__ == "OperationalError":
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        return Unavailable(f"state database {db} is unreachable: {first}", dependency="database")
    return None
