"""Reading a history table newest first by its key, a page at a time, until the caller stops.

For a search that ends at the first row that qualifies and whose test is Python's, not SQL's
(a rollback target's served snapshot: its body is parsed): the rows it reads are those
recorded since that row, however long the history is, where one query without a LIMIT read
(and sorted) them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVarTuple

from sqlalchemy import Row, Select
from sqlalchemy.orm import Session

Ts = TypeVarTuple("Ts")

FIRST_BOUND = 2**31 - 1
"""Above every key: the largest INTEGER (the keys' type). PostgreSQL refuses a larger
parameter for an INTEGER comparison ("integer out of range"); SQLite took 2**62."""


def newest_first(s: Session, page: Callable[[int, int], Select[int, *Ts]]) -> Iterator[Row[int, *Ts]]:
    """The rows of `page(below, size)` page after page: the caller's query of the rows whose
    key (its first column) is below `below`, newest first, `LIMIT size`. Pages of 8, then twice
    as many each time up to 256: what is sought is usually among the last few rows, and a first
    page of 64 read 64 rows whatever the history. Ends after a short page."""
    size, below = 8, FIRST_BOUND
    while True:
        rows = s.execute(page(below, size)).all()
        yield from rows
        if len(rows) < size:
            return
        below = rows[-1][0]
        size = min(size * 2, 256)
