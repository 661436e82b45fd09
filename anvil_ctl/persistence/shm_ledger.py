"""The shm ledger (`core.ports.ShmLedger`): shared-memory files managed containers were seen
holding, once per (boot, path, device, inode), so a file left behind is still known as ours."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from anvil_ctl.core.model import ShmMark
from anvil_ctl.persistence.models import ShmMarkRow
from anvil_ctl.persistence.store import Store, utcnow


def record_marks(store: Store, marks: Sequence[ShmMark]) -> int:
    """Append the marks not yet recorded; return how many were new."""
    if not marks:
        return 0
    with store.write() as s:
        boots = sorted({m.boot_id for m in marks})
        rows = s.execute(select(ShmMarkRow).where(ShmMarkRow.boot_id.in_(boots))).scalars()
        known = {(r.boot_id, r.path, r.dev, r.ino) for r in rows}
        new: list[ShmMark] = []
        for m in marks:
            key = (m.boot_id, m.path, m.dev, m.ino)
            if key not in known:
                known.add(key)
                new.append(m)
        for m in new:
            s.add(
                ShmMarkRow(
                    boot_id=m.boot_id,
                    path=m.path,
                    dev=m.dev,
                    ino=m.ino,
                    container_id=m.container_id,
                    at=utcnow(),
                )
            )
        if new:
            store.audit(
                s,
                "shm.marked",
                None,
                {"files": [{"path": m.path, "container_id": m.container_id} for m in new]},
            )
        return len(new)


def marks(store: Store, boot_id: str) -> list[ShmMark]:
    """Every mark recorded during the boot `boot_id`, oldest first."""
    q = select(ShmMarkRow).where(ShmMarkRow.boot_id == boot_id).order_by(ShmMarkRow.id)
    with store.read() as s:
        return [
            ShmMark(path=r.path, dev=r.dev, ino=r.ino, container_id=r.container_id, boot_id=r.boot_id)
            for r in s.execute(q).scalars()
        ]


class StoreShmLedger:
    """The ShmLedger port on the state database."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def marks(self, boot_id: str) -> list[ShmMark]:
        return marks(self.store, boot_id)

    def remember(self, marks: list[ShmMark]) -> None:
        record_marks(self.store, marks)
