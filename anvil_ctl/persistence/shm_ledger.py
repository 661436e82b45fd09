"""The shm ledger (`core.ports.ShmLedger`): shared-memory files managed containers were seen
holding, once per (boot, path, device, inode), so a file left behind is still known as ours."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from sqlalchemy import select

from anvil_ctl.core.model import ShmMark
from anvil_ctl.persistence.models import ShmMarkRow
from anvil_ctl.persistence.store import Store, utcnow


class StoreShmLedger:
    """The ShmLedger port on the state database."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def remember(self, marks: Sequence[ShmMark]) -> None:
        """Append the marks not yet recorded (one audit entry for the new ones)."""
        if not marks:
            return
        with self.store.write() as s:
            boots = sorted({m.boot_id for m in marks})
            rows = s.execute(select(ShmMarkRow).where(ShmMarkRow.boot_id.in_(boots))).scalars()
            seen = {(r.boot_id, r.path, r.dev, r.ino) for r in rows}
            fresh: list[ShmMark] = []
            for m in marks:
                if (key := (m.boot_id, m.path, m.dev, m.ino)) not in seen:
                    seen.add(key)
                    fresh.append(m)
            if fresh:
                s.add_all(ShmMarkRow(**asdict(m), at=utcnow()) for m in fresh)
                files = [{"path": m.path, "container_id": m.container_id} for m in fresh]
                self.store.audit(s, "shm.marked", None, {"files": files})

    def marks(self, boot_id: str) -> list[ShmMark]:
        """Every mark recorded during the boot `boot_id`, oldest first."""
        q = select(ShmMarkRow).where(ShmMarkRow.boot_id == boot_id).order_by(ShmMarkRow.id)
        with self.store.read() as s:
            return [
                ShmMark(path=r.path, dev=r.dev, ino=r.ino, container_id=r.container_id, boot_id=r.boot_id)
                for r in s.execute(q).scalars()
            ]
