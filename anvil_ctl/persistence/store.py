"""The Store: the transaction journal on SQLAlchemy, plus the identity records every command shares.

Each write is its own short database transaction, committed before the method returns (journal,
then act, then record), and appends the audit entry covering the history rows it inserted; the
head file advances after the commit. What is current is read from the projection.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import ColumnElement, Engine, Select, event, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session, UOWTransaction, sessionmaker

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.ports import Owner, StepEvent, TxRecord
from anvil_ctl.core.snapshot import Change, Snapshot, to_patch
from anvil_ctl.core.states import UNFINISHED_STATES, UNRESOLVED_STATES, TxState, check_transition
from anvil_ctl.persistence import audit, coverage, projection
from anvil_ctl.persistence import head as head_file
from anvil_ctl.persistence.audit import Head, Held
from anvil_ctl.persistence.current_models import IdentityCurrent, TxCurrent
from anvil_ctl.persistence.db import BUSY_MS, reader, translated
from anvil_ctl.persistence.models import (
    FIRST_HOST_ID,
    HostHistory,
    IdentityBody,
    IdentityRow,
    SnapshotBlob,
    SnapshotDiff,
    SnapshotRow,
    StepEventRow,
    Transaction,
    TransactionState,
)

BATCHED = "anvil.batched_audit"  # session.info key: the audit events a `together()` holds


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Store:
    """The transaction journal; one instance per process, safe to share across threads.

    `host_id`: this host's row in `hosts`; every history row written carries it. None (no host
    registered) reads as the first host and cannot write history.
    """

    def __init__(self, engine: Engine, *, head_path: Path | None = None, host_id: int | None = None) -> None:
        self.engine = engine
        self.head_path = head_path
        self.host_id = host_id
        self.host_name: str | None = None
        self.unregistered = False
        """Attached to a host name the database does not know yet: reads find nothing of it,
        and the first write registers it (`on_first_write`) before it writes."""
        self.on_first_write: Callable[[], None] | None = None
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(reader(engine), expire_on_commit=False)
        self._batch = threading.local()  # the session of this thread's `together()`, if any
        coverage.track(self._sessions)
        event.listen(self._sessions, "before_flush", self._stamp_host)

    @property
    def host(self) -> int:
        """The host whose records this Store reads and writes (0, which no host is, while
        this host is not registered yet)."""
        if self.unregistered:
            return 0
        return FIRST_HOST_ID if self.host_id is None else self.host_id

    def _stamp_host(self, session: Session, _ctx: UOWTransaction, _instances: object) -> None:
        """Every new history row names this host (before coverage digests it, after the flush)."""
        if self.host_id is None:
            return
        for obj in session.new:
            if isinstance(obj, HostHistory) and getattr(obj, "host_id", None) is None:
                obj.host_id = self.host_id

    @contextmanager
    def write(self, *, busy_ms: int | None = None) -> Iterator[Session]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed on leaving; then the head file
        advances. `busy_ms`: wait at most this long for another writer instead of the default."""
        shared: Session | None = getattr(self._batch, "session", None)
        if shared is not None:  # inside `together()`: its transaction, committed at its end
            yield shared
            return
        self.register()  # this host's first write: its registration commits first
        with translated(self.engine), self._sessions.begin() as session:
            if busy_ms is not None:  # before BEGIN IMMEDIATE, which reads it (`db.BUSY_MS`)
                session.connection(execution_options={BUSY_MS: busy_ms})
            session.info[audit.HOST] = self.host_id
            yield session
            held: list[Held] | None = session.info.pop(BATCHED, None)
            if held:  # one entry for the writes of a `together()`: their events in order, the rows of all
                event, tx_id, payload = audit.batch_entry(held)
                audit.append(session, at=utcnow(), tx_id=tx_id, event=event, payload=payload)
            advance_to = self._may_advance(session, session.info.get(audit.HEAD))
        self._advance(advance_to)

    def _may_advance(self, s: Session, new: Head | None) -> Head | None:
        """`new`, if the head file may move to it (`head_file.may_advance`, read in `s`)."""
        if new is None or self.head_path is None:
            return None
        return new if head_file.may_advance(self.head_path, new, lambda seq: audit.hash_at(s, seq)) else None

    def _advance(self, to: Head | None) -> None:
        if to is not None and self.head_path is not None:
            head_file.advance(self.head_path, to)

    def register(self) -> None:
        """Register the attached host now if it is not yet (`hosts.attach`; `init`)."""
        register, self.on_first_write = self.on_first_write, None
        if register is not None:
            register()

    @contextmanager
    def together(self) -> Iterator[None]:
        """The writes inside share one database transaction and one audit entry.

        Nothing inside may need to commit on its own (no side effect); a failure rolls all of it back.
        """
        if getattr(self._batch, "session", None) is not None:
            yield
            return
        with self.write() as session:
            session.info[BATCHED] = []
            self._batch.session = session
            try:
                yield
            finally:
                self._batch.session = None

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read transaction: never takes the write lock, so writers elsewhere do not block it.
        Inside `together()` it is that transaction: a read sees the writes before it."""
        shared: Session | None = getattr(self._batch, "session", None)
        if shared is not None:
            yield shared
            return
        with translated(self.engine), self._read_sessions() as session:
            yield session

    def audit(self, session: Session, event: str, tx_id: str | None, payload: Mapping[str, object]) -> None:
        """Append an audit entry covering the history rows added to `session` before it; inside
        `together()` it joins the one entry written at its end."""
        held: list[Held] | None = session.info.get(BATCHED)
        if held is not None:
            session.flush()  # the rows written for this event wait in the session's info
            held.append((event, tx_id, payload, len(session.info.get(coverage.PENDING) or [])))
            return
        audit.append(session, at=utcnow(), tx_id=tx_id, event=event, payload=payload)

    def head(self) -> Head:
        """The audit chain's head now: (seq, hash) of its last entry."""
        with self.read() as s:
            return audit.head(s)

    def sync_head_file(self) -> Head:
        """Bring the head file up to the chain's head (after a migration appended entries)."""
        with self.read() as s:
            now = audit.head(s)
            advance_to = self._may_advance(s, now)
        self._advance(advance_to if now.seq else None)
        return now

    def append_audit(self, event: str, tx_id: str | None, payload: Mapping[str, object]) -> None:
        """Append an audit entry on its own, for an event that has no row of its own."""
        with self.write() as s:
            self.audit(s, event, tx_id, payload)

    # -- The journal ---------------------------------------------------------------------------

    def begin(
        self,
        *,
        kind: str,
        slot: str | None,
        args: JSONObject,
        owner: Owner,
        tx_id: str,
    ) -> str:
        now = utcnow()
        with self.write() as s:
            tx = Transaction(
                id=tx_id,
                kind=kind,
                slot=slot,
                args_json=canonical_json(args),
                owner_pid=owner.pid,
                owner_host=owner.hostname,
                owner_boot_id=owner.boot_id,
                created_at=now,
            )
            first = TransactionState(tx_id=tx_id, state=TxState.PLANNED.value, at=now)
            s.add_all([tx, first])  # inserted in the order of their foreign key
            s.flush()
            projection.on_begin(s, tx, first)
            # Kind, slot and arguments are in the transaction's row, which this entry covers.
            self.audit(s, "tx.planned", tx_id, {})
        return tx_id

    def _state(self, s: Session, tx_id: str) -> TxState:
        row = s.execute(select(TxCurrent.state).where(TxCurrent.tx_id == tx_id)).scalar()
        if row is None:
            raise StateStoreError(f"transaction {tx_id} not found", tx_id=tx_id)
        return TxState(row)

    def state(self, tx_id: str) -> TxState:
        with self.read() as s:
            return self._state(s, tx_id)

    def transition(
        self, tx_id: str, target: TxState, reason: str = "", data: Mapping[str, object] | None = None
    ) -> None:
        with self.write() as s:
            source = self._state(s, tx_id)
            check_transition(source, target)
            row = TransactionState(
                tx_id=tx_id,
                state=target.value,
                reason=reason,
                data_json=canonical_json(data or {}),
                at=utcnow(),
            )
            s.add(row)
            s.flush()
            projection.on_transition(s, row)
            # reason and data are in the covered state row; the entry names the move.
            self.audit(s, f"tx.{target.value}", tx_id, {"from": source.value})

    def record(self, tx_id: str) -> TxRecord:
        with self.read() as s:
            return self._record(s, tx_id)

    def _record(self, s: Session, tx_id: str) -> TxRecord:
        tx = s.get(Transaction, tx_id)
        if tx is None:
            raise StateStoreError(f"transaction {tx_id} not found", tx_id=tx_id)
        return TxRecord(
            id=tx.id,
            kind=tx.kind,
            slot=tx.slot,
            args=json.loads(tx.args_json),
            owner=Owner(tx.owner_pid, tx.owner_host, tx.owner_boot_id),
            state=self._state(s, tx.id),
            created_at=tx.created_at,
        )

    def step_event(
        self,
        tx_id: str,
        *,
        seq: int,
        step: str,
        phase: str,
        event: str,
        detail: Mapping[str, object] | None = None,
    ) -> None:
        with self.write() as s:
            s.add(
                StepEventRow(
                    tx_id=tx_id,
                    seq=seq,
                    step=step,
                    phase=phase,
                    event=event,
                    detail_json=canonical_json(detail or {}),
                    at=utcnow(),
                )
            )
            # The step, its position and detail are in the covered step row.
            self.audit(s, f"step.{phase}.{event}", tx_id, {})

    def step_events(self, tx_id: str) -> list[StepEvent]:
        with self.read() as s:
            rows = s.execute(
                select(StepEventRow).where(StepEventRow.tx_id == tx_id).order_by(StepEventRow.id)
            ).scalars()
            return [StepEvent(r.seq, r.step, r.phase, r.event, json.loads(r.detail_json), r.at) for r in rows]

    def record_snapshot(self, tx_id: str | None, label: str, snapshot: Snapshot) -> int:
        """Add a `snapshots` row (and its blob when the content is new); returns the row's id."""
        with self.write() as s:
            now = utcnow()
            if s.get(SnapshotBlob, snapshot.sha256) is None:
                s.add(SnapshotBlob(sha256=snapshot.sha256, body_json=snapshot.canonical, at=now))
            row = SnapshotRow(tx_id=tx_id, label=label, sha256=snapshot.sha256, at=now)
            s.add(row)
            self.audit(s, "snapshot", tx_id, {})  # the covered rows hold label, hash and body
            return row.id

    def record_diff(
        self, tx_id: str, label: str, before: Snapshot, after: Snapshot, changes: list[Change]
    ) -> None:
        with self.write() as s:
            s.add(
                SnapshotDiff(
                    tx_id=tx_id,
                    label=label,
                    before_sha256=before.sha256,
                    after_sha256=after.sha256,
                    equal=int(not changes),
                    changes_json=canonical_json(to_patch(changes)),
                    at=utcnow(),
                )
            )
            self.audit(s, "snapshot.diff", tx_id, {})  # the covered diff row holds it all

    def _in_states(self, states: frozenset[TxState]) -> list[TxRecord]:
        """Transactions whose current state is one of `states`, oldest first: one indexed
        query on the projection, then each one's own row (there are few)."""
        with self.read() as s:
            rows = projection.tx_rows_in(s, frozenset(st.value for st in states), self.host)
            return [self._record(s, cur.tx_id) for cur in rows]

    def unresolved(self) -> list[TxRecord]:
        """Unfinished transactions plus those that wait for a person."""
        return self._in_states(UNRESOLVED_STATES)

    def unfinished(self) -> list[TxRecord]:
        return self._in_states(UNFINISHED_STATES)

    def watching(self, slot: str) -> TxRecord | None:
        """The slot's promote open in `watching` (a watch owns the slot) or left `interrupted`
        (a recover that failed: the candidate still routed), None when none is."""
        found = [
            r
            for r in self._in_states(frozenset({TxState.WATCHING, TxState.INTERRUPTED}))
            if r.slot == slot and r.kind == "promote"
        ]
        return found[-1] if found else None

    # -- identities: a body is stored once per content in `identity_bodies`, keyed by its digest --

    def record_identity(self, tx_id: str | None, role: str, identity: Identity) -> int:
        """Append the identity row (and its body when the content is new); its id."""
        with self.write() as s:
            digest, now = identity.digest, utcnow()
            if s.get(IdentityBody, digest) is None:
                s.add(IdentityBody(digest=digest, body_json=canonical_json(identity.as_dict()), at=now))
            row = IdentityRow(
                tx_id=tx_id,
                slot=identity.slot,
                role=role,
                digest=digest,
                container_id=identity.container_id,
                image_id=identity.image_id,
                served_model=identity.served_model,
                at=now,
            )
            s.add(row)
            s.flush()
            projection.on_identity(s, row)
            self.audit(s, f"identity.{role}", tx_id, {})  # the covered identity row holds it all
            return row.id

    def _identity(self, q: Select[str]) -> Identity | None:
        """The identity whose digest `q` selects first, None if it selects none."""
        with self.read() as s:
            digest = s.execute(q.limit(1)).scalar()
            if digest is None:
                return None
            body = s.get(IdentityBody, digest)
        if body is None:
            raise StateStoreError(f"identity body {digest} is missing from identity_bodies")
        return Identity.from_json(body.body_json)

    def current_identity(self, slot: str, role: str) -> Identity | None:
        """This host's latest identity of (slot, role), from the projection."""
        c = IdentityCurrent
        return self._identity(select(c.digest).where(c.host_id == self.host, c.slot == slot, c.role == role))

    def newest_committed_revision(self, slot: str) -> tuple[str, str] | None:
        """(transaction ID, kind) of the slot's newest committed revision, None if it has none: the
        revisions walked newest first through `ix_tx_current_revision`, those that did not commit
        (compensated, refused after they ran) passed over."""
        t = TxCurrent
        q = select(t.tx_id, t.kind).where(t.host_id == self.host, t.slot == slot, t.revision.is_not(None))
        with self.read() as s:
            row = s.execute(
                q.where(t.state == TxState.COMMITTED.value).order_by(t.revision.desc()).limit(1)
            ).first()
        return None if row is None else (row.tx_id, row.kind)

    def identity_of(self, tx_id: str, role: str) -> Identity | None:
        """The identity transaction `tx_id` recorded last in `role` (through `ix_identities_tx_id`)."""
        i = IdentityRow
        return self._identity(select(i.digest).where(i.tx_id == tx_id, i.role == role).order_by(i.id.desc()))

    def identity_by_ref(self, slot: str, ref: str) -> Identity | None:
        """This host's newest identity of `slot` (any role) whose container ID or digest starts
        with `ref`, or whose served model is `ref`."""

        # Newest first by key, stopping at the first match, the match tested in SQL: the identities
        # recorded since it, not all of them. The slot is compared as `slot || ''`, which no index
        # serves: through ix_identities_slot_role_id SQLite would read every identity of the slot
        # and sort them before the first row.
        def starts(column: InstrumentedAttribute[str]) -> ColumnElement[bool]:
            return func.substr(column, 1, len(ref)) == ref  # exactly, not as a LIKE pattern

        i = IdentityRow
        return self._identity(
            select(i.digest)
            .where(i.slot.concat("") == slot, i.host_id == self.host)
            .where(or_(starts(i.container_id), starts(i.digest), i.served_model == ref))
            .order_by(i.id.desc())
        )
