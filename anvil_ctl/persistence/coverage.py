"""Which rows the audit chain covers, and the canonical digest of each.

Every row of a history table is listed by the entry written in its database transaction as
`[table, key, digest]`; the digest is SHA-256 of `{"table", "row"}` without NULL columns.
`track` collects inserted rows after each flush and refuses a commit that leaves one uncovered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from sqlalchemy import RowMapping, Table, event
from sqlalchemy.orm import Session, UOWTransaction, sessionmaker

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.persistence.models import HISTORY_TABLES, Base

RowKey = str | int
RowRef = tuple[str, RowKey, str]  # (table, key, digest)
RowValues: TypeAlias = Mapping[str, object] | RowMapping
"""A row's values by column name: an ORM instance's (`_collect`) or a Core row's."""

COVERED: dict[str, Table] = {name: Base.metadata.tables[name] for name in HISTORY_TABLES}
"""name -> table, for every table whose rows the chain covers."""

PENDING = "anvil.uncovered_rows"


class UncoveredRows(RuntimeError):
    """Misuse: history rows were about to commit without the audit entry that covers them."""


def _value(value: object) -> str | int | None:
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, str | int):
        return value
    raise TypeError(f"history column value {value!r}: expected str, int or None")


def key_of(table: Table, values: RowValues) -> RowKey:
    """A row's key: the value of its (single-column) primary key."""
    (column,) = table.primary_key.columns
    key = values[column.name]
    if not isinstance(key, str | int) or isinstance(key, bool):
        raise TypeError(f"{table.name}: key {key!r} is neither text nor an integer")
    return key


def row_digest(table: Table, values: RowValues) -> str:
    """SHA-256 of the row's canonical JSON, table name included (see the module doc)."""
    row = {c.name: v for c in table.columns if (v := _value(values[c.name])) is not None}
    return sha256_hex({"table": table.name, "row": row})


def ref_of(table: Table, values: RowValues) -> RowRef:
    return (table.name, key_of(table, values), row_digest(table, values))


def _collect(session: Session, _flush_context: UOWTransaction) -> None:
    # after_flush: the flushed objects are still in session.new, with their keys and
    # defaults filled in; what they hold now is what the INSERT wrote.
    pending: list[RowRef] = session.info.setdefault(PENDING, [])
    for obj in session.new:
        table = COVERED.get(obj.__table__.name)
        if table is not None:
            pending.append(ref_of(table, {c.name: getattr(obj, c.key) for c in obj.__mapper__.columns}))


def _refuse_uncovered(session: Session) -> None:
    session.flush()
    pending = session.info.get(PENDING)
    if pending:
        session.info[PENDING] = []
        raise UncoveredRows(
            "history rows written without an audit entry: " + ", ".join(f"{t}:{k}" for t, k, _ in pending[:5])
        )


def track(sessions: sessionmaker[Session]) -> None:
    """Cover every history row inserted through `sessions` (see the module doc)."""
    event.listen(sessions, "after_flush", _collect)
    event.listen(sessions, "before_commit", _refuse_uncovered)


def take_pending(session: Session) -> list[RowRef]:
    """The history rows flushed in `session` since the last audit entry; they are now taken."""
    session.flush()
    pending: list[RowRef] = session.info.get(PENDING) or []
    session.info[PENDING] = []
    return pending
