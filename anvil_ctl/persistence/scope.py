"""Which host a query answers for: the one predicate every host-scoped read uses.

History rows written before migration 0009 have no host (`host_id` NULL): they are the
database's first host's (`FIRST_HOST_ID`). So the first host's rows are those with its id
or none, and any other host's those with its id. The projection never holds a NULL host.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, or_
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
