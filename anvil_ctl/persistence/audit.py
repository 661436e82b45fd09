"""The hash-chained audit journal: appending entries, the chain's head, and the head file.

Each entry hashes the previous entry's hash and its own canonical content, including the
digests of the history rows written with it (`coverage`). The head, `(seq, hash)` of the last
entry, is what witnesses outside the database record (the head file, `--expect-head`). A cut
tail leaves no trace inside the database; the head file beside it shows the cut. It only
advances, and only from a position the database still holds; behind after a crash is harmless.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from anvil_ctl.atomic import atomic_write
from anvil_ctl.core.digest import canonical_json, sha256_hex
from anvil_ctl.core.errors import BadInput
from anvil_ctl.log import get_logger
from anvil_ctl.persistence.coverage import RowRef, RowValues, take_pending
from anvil_ctl.persistence.models import AuditEntry

log = get_logger(__name__)

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


# -- the head file ------------------------------------------------------------------------------

HEAD_RE = re.compile(r"^(\d{1,18}):([0-9a-f]{64})$")


def parse_head(text: str, *, what: str = "--expect-head") -> Head:
    """`SEQ:HASH` (a positive entry number and 64 lowercase hex digits)."""
    match = HEAD_RE.match(text.strip())
    if match is None or int(match.group(1)) < 1:
        raise BadInput(f"{what}: expected SEQ:HASH (entry number, 64 hex digits), got {text!r}", field=what)
    return Head(int(match.group(1)), match.group(2))


def database_file(db_url: str) -> Path | None:
    """The file of an SQLite database URL; None for a server database (or in memory)."""
    url = make_url(db_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):  # an SQLite URI filename (`?uri=true`): its path part
        return Path(url.database.removeprefix("file:").split("?", 1)[0])
    return Path(url.database)


def head_path_for(db_url: str, state_dir: Path) -> Path:
    """Where the head file of the database at `db_url` lives (see the module doc)."""
    db_file = database_file(db_url)
    if db_file is not None:
        return db_file.with_name(db_file.name + ".head")
    return state_dir / "audit-head.json"


class HeadFileError(ValueError):
    """The head file exists but is not one (unreadable, not JSON, wrong fields)."""


def read_head(path: Path) -> Head | None:
    """The head the file records; None if there is no file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HeadFileError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(raw)
        return parse_head(f"{data['seq']}:{data['hash']}", what=str(path))
    except (ValueError, KeyError, TypeError, BadInput):
        raise HeadFileError(f"{path}: not a head file (expected JSON with seq and hash)") from None


def set_aside(path: Path, stamp: str) -> Path | None:
    """Move a head file that belongs to no database any more out of the way; where it went."""
    if not path.exists():
        return None
    target = path.with_name(f"{path.name}.stale-{stamp}")
    path.rename(target)
    log.warning("audit.head_set_aside", path=str(path), moved_to=str(target))
    return target


def may_advance(path: Path, new: Head, session: Session) -> bool:
    """Whether the head file may move to `new`: it is behind, and the database still holds
    the entry it names (read in `session`, the writer's transaction)."""
    try:
        old = read_head(path)
    except HeadFileError as exc:
        log.error("audit.head_kept", path=str(path), error=str(exc))
        return False
    if old is None:
        return True
    if old.seq >= new.seq:
        return False  # another writer got further first
    held = hash_at(session, old.seq)
    if held != old.hash:
        log.error(
            "audit.head_kept",
            path=str(path),
            head=str(old),
            found=held,
            why="the database no longer holds the head file's entry; run `anvilctl audit verify`",
        )
        return False
    return True


def advance(path: Path, new: Head) -> None:
    """Write `new` unless the file got ahead meanwhile; a failure is logged, never raised:
    the commit it follows stands."""
    try:
        old = read_head(path)
        if old is not None and old.seq >= new.seq:
            return
        atomic_write(path, json.dumps({"hash": new.hash, "seq": new.seq}) + "\n")
    except (OSError, HeadFileError) as exc:
        log.warning("audit.head_unwritten", path=str(path), head=str(new), error=str(exc))
        return
    log.debug("audit.head", seq=new.seq, hash=new.hash)
