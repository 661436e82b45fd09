"""The lock table: one row per host-lock acquisition, and a release row when it ends.

The OS lock (`engine.lock.HostLock`) is what excludes; a row says who holds it. A row without
a release was held by an owner that may have died; the projection's `lock_held` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256

from sqlalchemy import Connection, select, text

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.ports import Owner
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.current_models import LockHeld
from anvil_ctl.persistence.db import translated
from anvil_ctl.persistence.models import LockRelease, LockRow
from anvil_ctl.persistence.store import Store, utcnow


@dataclass(frozen=True)
class LockRecord:
    """A lock row as recorded; whether its owner still lives is for the caller to find out."""

    id: str
    host: str
    pid: int
    boot_id: str
    command: str
    tx_id: str | None
    since: str


def record_lock(store: Store, lock_id: str, *, owner: Owner, command: str, tx_id: str | None) -> None:
    """Write the row of a lock `owner` has just taken, with its audit entry."""
    with store.write() as s:
        row = LockRow(
            id=lock_id,
            host=owner.hostname,
            pid=owner.pid,
            boot_id=owner.boot_id,
            command=command,
            tx_id=tx_id,
            since=utcnow(),
        )
        s.add(row)
        s.flush()
        projection.on_lock(s, row)
        store.audit(s, "lock.acquired", tx_id, {})  # the covered lock row holds it all


def release_row(store: Store, lock_id: str, *, how: str, by: str, reason: str = "") -> None:
    """Append the release of `lock_id` (how: released, recovered, broken); once only."""
    with store.write() as s:
        row = s.get(LockRow, lock_id)
        if row is None:
            raise BadInput(f"lock {lock_id} not found", field="lock_id")
        if s.execute(select(LockRelease).where(LockRelease.lock_id == lock_id)).scalar():
            raise BadInput(f"lock {lock_id} is already released", field="lock_id")
        s.add(LockRelease(lock_id=lock_id, how=how, by=by, reason=reason, at=utcnow()))
        s.flush()
        projection.on_lock_release(s, lock_id)
        # under the lock's transaction: the release commits with that transaction's end state
        store.audit(s, f"lock.{how}", row.tx_id, {})  # the covered release row holds it all


def unreleased(store: Store) -> list[LockRecord]:
    """The Store's host's lock rows without a release, newest first."""
    with store.read() as s:
        q = select(LockRow).join(LockHeld, LockHeld.lock_id == LockRow.id)
        q = q.where(LockHeld.host_id == store.host).order_by(LockHeld.since.desc())
        return [
            LockRecord(r.id, r.host, r.pid, r.boot_id, r.command, r.tx_id, r.since)
            for r in s.execute(q).scalars()
        ]


class AdvisoryLock:
    """On PostgreSQL, a session advisory lock keyed by the host's name, held on its own connection
    for as long as the host lock: it excludes a second mutator of the same host wherever it runs.
    On SQLite there is nothing to take: the OS lock beside the database excludes."""

    def __init__(self, store: Store, host: str) -> None:
        self.engine = store.engine
        # a stable signed 64-bit key (PostgreSQL's bigint) for the host's name
        self.key = int.from_bytes(
            sha256(b"anvil-host-lock:" + host.encode()).digest()[:8], "big", signed=True
        )
        self._conn: Connection | None = None

    def try_acquire(self) -> bool:
        """Take it now, or False if another session holds it (never waits)."""
        if self.engine.dialect.name != "postgresql" or self._conn is not None:
            return True
        with translated(self.engine):
            conn = self.engine.connect()
            try:
                got = bool(
                    conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar()
                )
                conn.commit()  # the lock is the session's, not the transaction's
            except BaseException:
                conn.close()
                raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        """Give it back (closing the connection would too: the server drops a session's locks)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            with translated(self.engine):
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
                conn.commit()
        finally:
            conn.close()
