"""One mutator per host: an OS file lock (on PostgreSQL also a session advisory lock) excludes; a
lock row says who holds it: a dead holder's row refuses mutators until `recover` or `lock break`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from anvil_ctl.core.errors import BadInput, LockHeld, Refused
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.ports import Owner
from anvil_ctl.engine.owner import owner_alive
from anvil_ctl.persistence import locks
from anvil_ctl.persistence.store import Store


@dataclass(frozen=True)
class LockInfo(locks.LockRecord):
    """A lock row and whether its owner still lives (None: an owner on another host)."""

    alive: bool | None

    def describe(self) -> str:
        state = {True: "alive", False: "dead", None: "on another host"}[self.alive]
        tx = f", transaction {self.tx_id}" if self.tx_id else ""
        return (
            f"lock {self.id} held by pid {self.pid} on {self.host} ({state}), "
            f"command {self.command}{tx}, since {self.since}"
        )

    def as_dict(self) -> JSONObject:
        return asdict(self)


def held_locks(store: Store, me: Owner | None = None) -> list[LockInfo]:
    """The host's lock rows without a release, newest first; `me` judges which owners still live."""
    rows = locks.unreleased(store)
    return [LockInfo(**asdict(r), alive=owner_alive(Owner(r.pid, r.host, r.boot_id), me)) for r in rows]


class HostLock:
    """Acquire with `acquire()`, release with `release()`; the OS releases the flock on death."""

    def __init__(
        self, store: Store, path: Path, owner: Owner, command: str, tx_id: str | None = None
    ) -> None:
        self.store = store
        self.tx_id = tx_id
        self.path = path
        self.owner = owner
        self.command = command
        self.lock_id: str | None = None
        self._fd: int | None = None
        self._advisory = locks.AdvisoryLock(store, owner.hostname)

    def acquire(self, *, take_over_dead: bool = False, claim: bool = True) -> list[LockInfo]:
        """Take the host lock or raise LockHeld naming the owner. `take_over_dead` (`recover`):
        stale rows are returned instead of refusing. Without `claim` the row is written later."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holders = [h for h in held_locks(self.store, self.owner) if h.alive]
            raise _held(holders, _file_owner(self.path)) from None
        self._fd = fd
        self._stamp(None)  # first: a process refused from now on can name our pid
        try:
            if not self._advisory.try_acquire():
                # A mutator of this host that took its lock through another lock file.
                holders = [h for h in held_locks(self.store, self.owner) if h.alive is not False]
                elsewhere = f"a mutator of host {self.owner.hostname} holds its lock in the state database"
                raise _held(holders, elsewhere + " (checking its arguments)")
            rows = held_locks(self.store, self.owner)
            # We hold the flock, yet a row claims a live owner: the lock file was replaced or a
            # PID was reused. Never run beside a possible mutator.
            live = [h for h in rows if h.alive]
            if live:
                raise _held(live, "")
            stale = [h for h in rows if h.alive is not True]
            if stale and not take_over_dead:
                raise LockHeld(
                    f"stale {stale[0].describe()}; run `anvilctl recover` "
                    f"(or `anvilctl lock break {stale[0].id}`)",
                    owner=stale[0].as_dict(),
                )
            if claim:
                self.claim()
        except BaseException:
            self._unlock_fd()  # a refusal, or the database unavailable: hold nothing
            raise
        return stale

    def claim(self) -> None:
        """Write the lock row naming this owner (once; the OS lock must be held)."""
        if self._fd is None:
            raise RuntimeError("claim() without the OS lock")
        if self.lock_id is not None:
            return
        lock_id = str(uuid.uuid4())
        locks.record_lock(self.store, lock_id, owner=self.owner, command=self.command, tx_id=self.tx_id)
        self.lock_id = lock_id
        self._stamp(lock_id)

    def _stamp(self, lock_id: str | None) -> None:
        """Say in the lock file who holds the OS lock, for a refused process to name."""
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({"lock_id": lock_id, "pid": self.owner.pid}).encode(), 0)

    def release_row(self) -> None:
        """Record the row's release now; the OS lock stays held until `release()`."""
        if self.lock_id is not None:
            locks.release_row(self.store, self.lock_id, how="released", by=f"pid {self.owner.pid}")
            self.lock_id = None

    def release(self) -> None:
        self.release_row()
        self._unlock_fd()

    def _unlock_fd(self) -> None:
        self._advisory.release()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def release_after(self, exc: BaseException) -> None:
        """Release once the holder's work failed with `exc`."""
        if isinstance(exc, BadInput | Refused):
            self.release()  # nothing was mutated: bad input and refusals come before any step
        else:
            # The command died mid-transaction (Ctrl-C, a failed journal write): keep the row so
            # the next mutator is refused until `recover` has compensated what was left.
            self._unlock_fd()


def _held(holders: list[LockInfo], otherwise: str) -> LockHeld:
    """The refusal naming the first live holder, else what `otherwise` says."""
    detail = holders[0].describe() if holders else otherwise
    return LockHeld(
        f"another mutator holds this host: {detail}", owner=holders[0].as_dict() if holders else None
    )


def _file_owner(path: Path) -> str:
    """Who holds the lock file, as it says (an empty one is read again for a moment)."""
    deadline = time.monotonic() + 0.5  # for the holder to write its pid
    try:
        text = path.read_text()
        while not text and time.monotonic() < deadline:
            time.sleep(0.01)
            text = path.read_text()
        data = json.loads(text or "{}")
        if data.get("lock_id") is None:
            return f"pid {data.get('pid')} holds the lock file {path} (checking its arguments)"
        return f"lock {data.get('lock_id')} held by pid {data.get('pid')}"
    except (OSError, ValueError):
        return f"lock file {path} is held by another process"
