"""The head file: the audit chain's last position, kept outside the database.

A cut tail leaves no trace inside the database; the head file beside it shows the cut. It only
advances, and only from a position the database still holds; behind after a crash is harmless.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import make_url

from anvil_ctl.atomic import atomic_write
from anvil_ctl.core.errors import BadInput
from anvil_ctl.log import get_logger
from anvil_ctl.persistence.audit import Head

log = get_logger(__name__)


def parse_head(text: str, *, what: str = "--expect-head") -> Head:
    """`SEQ:HASH` (a positive entry number and 64 lowercase hex digits)."""
    match = re.match(r"^(\d{1,18}):([0-9a-f]{64})$", text.strip())
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


def may_advance(path: Path, new: Head, hash_at: Callable[[int], str | None]) -> bool:
    """Whether the head file may move to `new`: it is behind, and the database still holds
    the entry it names. `hash_at(seq)` reads an entry's hash inside the writer's transaction."""
    try:
        old = read_head(path)
    except HeadFileError as exc:
        log.error("audit.head_kept", path=str(path), error=str(exc))
        return False
    if old is None:
        return True
    if old.seq >= new.seq:
        return False  # another writer got further first
    held = hash_at(old.seq)
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
