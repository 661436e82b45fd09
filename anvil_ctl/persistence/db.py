"""Database engines: SQLite with WAL, foreign keys, synchronous=FULL and a busy timeout.

SQLite write transactions begin with BEGIN IMMEDIATE so that two writers never
both read the audit chain's tail and append after it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool

__all__ = ["Engine", "make_engine"]  # Engine: the handle callers hold, without importing sqlalchemy

BUSY_TIMEOUT_MS = 10_000


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            poolclass=NullPool,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "isolation_level": None},
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)
