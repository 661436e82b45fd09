"""The hash-chained audit journal: appending entries, and the chain's head.

Each entry hashes the previous entry's hash and its own canonical content, including the
digests of the history rows written with it (`coverage`). The head, `(seq, hash)` of the last
entry, is what witnesses outside the database record (the head file, `--expect-head`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json, sha256_hex
from anvil_ctl.persistence.coverage import RowRef, RowValues, take_pending
from anvil_ctl.persistence.models import AuditEntry

GENESIS = "0" * 64
LINK_TAG = 8
"""Hex digits of the previous hash an entry keeps in `prev_hash`."""
ROW_DIGEST_BYTES = 16
"""Bytes of a covered row's SHA-256 an entry lists: 128 bits, so a row edited to match
needs a second preimage (2**128 work); the entry's own hash keeps all 32."""
AUDIT_LOCK_KEY = 0x616E76696C  # "anvil"
HEAD = "anvil.audit_head"  # session.info key: the head this session's entries made
HOST = "anvil.host_id"  # session.info key: the host this session writes for (Store.write sets it)


@dataclass(frozen=True, order=True)
class Head:
    """A chain position: entry `seq` and its hash (`SEQ:HASH` on the command line)."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"


EMPTY = Head(0, GENESIS)


def entry_hash(prev_hash: str, entry: RowValues) -> str:
    """The hash of an entry (its `audit_journal` columns): the previous hash and its content."""
    body = {
        "id": entry["id"],
        "at": entry["at"],
        "tx_id": entry["tx_id"],
        "event": entry["event"],
        "payload": entry["payload_json"],
        "rows": entry["rows_json"],
        "host": entry["host_id"],
    }
    return sha256_hex(prev_hash + "|" + canonical_json(body))


def compact_digest(hex_digest: str) -> str:
    """A row digest as `rows_json` holds it: its first `ROW_DIGEST_BYTES` bytes in unpadded
    base64url (22 characters)."""
    raw = bytes.fromhex(hex_digest)[:ROW_DIGEST_BYTES]
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def digest_bytes(digest: str) -> bytes:
    """The bytes of a `rows_json` digest; ValueError if it is not one."""
    raw = base64.urlsafe_b64decode(digest + "==") if len(digest) == 22 else b""
    if len(raw) != ROW_DIGEST_BYTES:
        raise ValueError(digest)
    return raw


def append(
    session: Session,
    *,
    at: str,
    tx_id: str | None,
    event: str,
    payload: Mapping[str, object],
    rows: Sequence[RowRef] = (),
) -> Head:
    """Append one entry covering the history rows flushed in `session` since the last one
    (plus `rows`). On PostgreSQL a transaction-scoped advisory lock serializes appenders, so
    hosts sharing one database never fork the chain."""
    covered = [*take_pending(session), *rows]
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
    last = head(session)
    prev_hash, row_id = last.hash, last.seq + 1
    body = canonical_json(payload)
    rows_json = canonical_json([[t, k, compact_digest(d)] for t, k, d in covered])
    host = session.info.get(HOST)
    if not isinstance(host, int):
        raise RuntimeError("an audit entry needs the host it is written for (Store.write sets it)")
    values: dict[str, str | int | None] = {
        "host_id": host,
        "id": row_id,
        "at": at,
        "tx_id": tx_id,
        "event": event,
        "payload_json": body,
        "prev_hash": prev_hash[:LINK_TAG],
        "rows_json": rows_json,
    }
    values["hash"] = digest = entry_hash(prev_hash, values)
    session.execute(insert(AuditEntry).values(values))
    new = Head(row_id, digest)
    session.info[HEAD] = new
    return new


Held = tuple[str, str | None, Mapping[str, object], int]
"""An audit event a `Store.together()` holds: name, transaction, payload, and how many
history rows were pending in the session after it (its own rows are the difference)."""


def batch_entry(held: Sequence[Held]) -> tuple[str, str | None, Mapping[str, object]]:
    """The one entry (event, transaction, payload) for the events of a `together()`: a single
    event as itself; several as a `batch`, leaving out the events whose own rows name them."""
    if len(held) == 1:
        event, tx_id, payload, _rows = held[0]
        return event, tx_id, payload
    tx_ids = {t for _e, t, _p, _r in held}
    tx_id = tx_ids.pop() if len(tx_ids) == 1 else None
    events: list[object] = []
    before = 0
    for e, t, p, pending in held:
        own_rows, before = pending - before, pending
        if p or tx_id is None:
            events.append({"event": e, **p, **({"tx_id": t} if tx_id is None else {})})
        elif own_rows <= 0:  # none of its own (or taken by an entry written meanwhile)
            events.append(e)
    return "batch", tx_id, ({"events": events} if events else {})


def head(session: Session) -> Head:
    """The last entry's position, or `EMPTY` for an empty journal."""
    last = session.execute(
        select(AuditEntry.id, AuditEntry.hash).order_by(AuditEntry.id.desc()).limit(1)
    ).first()
    return Head(last.id, last.hash) if last else EMPTY


def hash_at(session: Session, seq: int) -> str | None:
    """The hash of entry `seq`, None if there is no such entry."""
    return session.execute(select(AuditEntry.hash).where(AuditEntry.id == seq)).scalar()
