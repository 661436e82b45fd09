"""The lock table: one row per host-lock acquisition, and a release row when it ends.

The OS lock (`anvil_ctl.engine.lock.HostLock`) is what excludes; a row says who
holds it (pid, host, boot id, command, transaction, since). A row without a
release row is held, or was held by an owner that died; rows are never
updated. The projection's `lock_held` lists those rows, written with them. Both
writes are audited (`lock.acquired`, `lock.<how>`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.ports import Owner
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.models import LockHeld, LockRelease, LockRow
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
        if s.get(LockRow, lock_id) is None:
            raise BadInput(f"lock {lock_id} not found", field="lock_id")
        if s.execute(select(LockRelease).where(LockRelease.lock_id == lock_id)).scalar():
            raise BadInput(f"lock {lock_id} is already released", field="lock_id")
        s.add(LockRelease(lock_id=lock_id, how=how, by=by, reason=reason, at=utcnow()))
        s.flush()
        projection.on_lock_release(s, lock_id)
        store.audit(s, f"lock.{how}", None, {})  # the covered release row holds it all


def unreleased(store: Store, host: str | None = None) -> list[LockRecord]:
    """Lock rows without a release, newest first, optionally of one host."""
    with store.read() as s:
        q = select(LockRow).join(LockHeld, LockHeld.lock_id == LockRow.id).order_by(LockHeld.since.desc())
        if host:
            q = q.where(LockHeld.host == host)
        return [
            LockRecord(r.id, r.host, r.pid, r.boot_id, r.command, r.tx_id, r.since)
            for r in s.execute(q).scalars()
        ]
