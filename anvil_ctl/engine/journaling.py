"""Journal, then act, then record: how the engine's journal writes commit, and where faults strike.

An intent, an error and a state change commit before the runner goes on (`commit`); a
record of what was observed (a step's result, a snapshot, a diff) is held (`hold`) and
commits together with the next of those, in one database transaction and one audit
entry. Nothing acts between a record and that next write, so no intent waits on a
record, and a death in between looks like a death just before the record, which
recovery already handles (the step may or may not be done).

Every write passes its boundary to `anvil_ctl.engine.faults` once it is committed,
where tests and `make chaos` may crash or pause the process.
"""

from __future__ import annotations

from collections.abc import Callable

from anvil_ctl.core.ports import Journal
from anvil_ctl.engine.faults import Faults


class JournalWriter:
    """The engine's writes to its journal: held records, committed with the next write."""

    def __init__(self, journal: Journal, faults: Faults) -> None:
        self.journal = journal
        self.faults = faults
        self._held: list[tuple[Callable[[], object], str]] = []

    def hold(self, write: Callable[[], object], boundary: str) -> None:
        """Keep `write` (a record) until the next `commit`."""
        self._held.append((write, boundary))

    def commit(self, write: Callable[[], object] | None = None, boundary: str | None = None) -> None:
        """Write what is held and then `write`, as one; then pass their boundaries."""
        held, self._held = self._held, []
        todo = [*held, *([(write, boundary or "")] if write is not None else [])]
        if not todo:
            return
        if len(todo) == 1:
            todo[0][0]()
        else:
            with self.journal.together():
                for w, _b in todo:
                    w()
        for _w, b in todo:
            if b:
                self.faults.at(b)
