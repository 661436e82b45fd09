"""The declarative base, and the fleet's hosts table that every history row refers to.

A module of its own so that `models` (history) and `current_models` (the projection)
share them; import them from `models`.
"""

from __future__ import annotations

from sqlalchemy import ForeignKey, Index, MetaData, SmallInteger, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


FIRST_HOST_ID = 1
"""The database's first host: rows written before migration 0009 (`host_id` NULL) are its."""


class Host(Base):
    """A host of the fleet: its name (anvil.toml `[host] name`) and the machine that claimed it.

    History: registered once, never changed (a second machine claiming the name is refused).
    """

    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    machine_id: Mapped[str] = mapped_column(String(64))
    boot_id: Mapped[str] = mapped_column(String(64))
    registered_at: Mapped[str] = mapped_column(String(32))


def host_column() -> Mapped[int | None]:
    """The host a history row was written on (migration 0009); NULL: the first host, since the
    row was written before the column existed (a NULL column stays out of the row's digest)."""
    return mapped_column(SmallInteger, ForeignKey("hosts.id"), nullable=True)


_POSTGRESQL_WHERE = "anvil_postgresql_where"


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index over the rows for which `where` holds, on SQLite and on PostgreSQL.

    PostgreSQL's `postgresql_where` is kept in the index's `info` and set by
    `add_postgresql_options` when a PostgreSQL engine is made: naming a dialect's option at
    construction loads that dialect to validate it, and `sqlalchemy.dialects.postgresql`
    (all its drivers' modules, ~45 ms) is what every command on SQLite would otherwise pay.
    """
    return Index(name, *columns, sqlite_where=text(where), info={_POSTGRESQL_WHERE: where})


def add_postgresql_options(metadata: MetaData) -> None:
    """Give every `partial_index` of `metadata` its PostgreSQL `WHERE` (idempotent)."""
    for table in metadata.tables.values():
        for index in table.indexes:
            where = index.info.get(_POSTGRESQL_WHERE)
            if where is not None and index.dialect_options["postgresql"]["where"] is None:
                index.dialect_options["postgresql"]["where"] = text(where)
