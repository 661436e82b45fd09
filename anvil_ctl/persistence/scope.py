"""Which host a query answers for: the one predicate every host-scoped read uses.

History rows written before migration 0009 have no host (`host_id` NULL): they are the
database's first host's (`FIRST_HOST_ID`). So the first host's rows are those with its id
or none, and any other host's those with its id. The projection never holds a NULL host.

`host_key` is the same predicate as one value (`coalesce(host_id, 1)`), for a history table
read newest first per host: an index on it and the key (`ix_rechecks_host_key_id`) answers
any host's newest rows by a search, where `on_host`'s OR could only walk the table.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, literal_column, or_
from sqlalchemy.orm import InstrumentedAttribute

from anvil_ctl.persistence.base import FIRST_HOST_ID


def on_host(
    column: InstrumentedAttribute[int | None] | ColumnElement[int | None], host: int
) -> ColumnElement[bool]:
    """`column` (a history table's `host_id`) names host `host`."""
    if host == FIRST_HOST_ID:
        return or_(column == host, column.is_(None))
    return column == host


def on_host_sql(column: str, host: int) -> str:
    """The same predicate as SQL text, with `:host` as its parameter (the caller binds it)."""
    if host == FIRST_HOST_ID:
        return f"({column} = :host OR {column} IS NULL)"
    return f"{column} = :host"


HOST_KEY_SQL = f"coalesce(host_id, {FIRST_HOST_ID})"
"""The host a history row is of, NULL being the first host's, as an index expression."""


def host_key(column: InstrumentedAttribute[int | None] | ColumnElement[int | None]) -> ColumnElement[int]:
    """`HOST_KEY_SQL` of `column`: compared with a host, it is `on_host` in the form an index on
    `HOST_KEY_SQL` serves (the first host a literal: SQLite matches an index expression only
    to the same expression, and a bound parameter is not the same)."""
    return func.coalesce(column, literal_column(str(FIRST_HOST_ID)))
