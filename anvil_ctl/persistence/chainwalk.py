"""Walking the audit chain: each entry's id, link and hash, and the refs of the rows it covers."""

from __future__ import annotations

import json
from array import array
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence import audit
from anvil_ctl.persistence.audit import Head
from anvil_ctl.persistence.coverage import COVERED, RowKey
from anvil_ctl.persistence.models import AuditEntry

BATCH = 5000
_SIZE = audit.ROW_DIGEST_BYTES


@dataclass(frozen=True)
class Problem:
    """One way the record differs from its chain: which entry, or which row of which table."""

    problem: str
    entry: int | None = None
    table: str | None = None
    key: RowKey | None = None

    def as_dict(self) -> JSONObject:
        """As `audit verify --json` prints it (`row_id`: the entry)."""
        out: JSONObject = {"row_id": self.entry, "problem": self.problem}
        if self.table is not None:
            out["table"] = self.table
        if self.key is not None:
            out["key"] = self.key
        return out


class Refs:
    """The digests the chain recorded for one table's rows, by key, with the entry of each.

    Dense integer keys live in flat arrays (a full walk holds millions); others in a dict.
    """

    def __init__(self) -> None:
        self._digests = bytearray()
        self._entries = array("Q")  # 0: no ref for this key
        self._dense = 0
        self._other: dict[RowKey, tuple[bytes, int]] = {}

    def _slot(self, key: RowKey, grow: bool) -> int | None:
        if not isinstance(key, int) or isinstance(key, bool) or key < 1:
            return None
        if key < len(self._entries):
            return key
        if not grow or key > 4 * (len(self) + 256):  # far beyond the refs there are: sparse
            return None
        size = max(key + 1, 2 * len(self._entries), 1024)
        self._entries.extend([0] * (size - len(self._entries)))
        self._digests.extend(bytes(_SIZE * size - len(self._digests)))
        return key

    def add(self, key: RowKey, digest: bytes, entry: int) -> int | None:
        """Record `key`'s digest; returns the entry that already covered it, if one did."""
        slot = self._slot(key, grow=True)
        if slot is None:
            earlier = self._other.get(key)
            self._other[key] = (digest, entry)
            return earlier[1] if earlier else None
        previous = self._entries[slot]
        self._entries[slot] = entry
        self._digests[_SIZE * slot : _SIZE * (slot + 1)] = digest
        self._dense += previous == 0
        return previous or None

    def pop(self, key: RowKey) -> tuple[bytes, int] | None:
        slot = self._slot(key, grow=False)
        if slot is None or not self._entries[slot]:
            return self._other.pop(key, None)
        entry = self._entries[slot]
        self._entries[slot] = 0
        self._dense -= 1
        return bytes(self._digests[_SIZE * slot : _SIZE * (slot + 1)]), entry

    def items(self) -> Iterator[tuple[RowKey, int]]:
        """(key, entry) of every ref not popped yet."""
        for key, entry in enumerate(self._entries):
            if entry:
                yield key, entry
        for other, (_digest, entry) in self._other.items():
            yield other, entry

    def __len__(self) -> int:
        return self._dense + len(self._other)

    def __contains__(self, key: RowKey) -> bool:
        slot = self._slot(key, grow=False)
        return bool(self._entries[slot]) if slot is not None else key in self._other


@dataclass
class Walk:
    """Entries walked: where they ended, and the rows they cover."""

    end: Head
    entries: int = 0
    refs: dict[str, Refs] = field(default_factory=lambda: defaultdict(Refs))


def walk(s: Session, start: Head, problems: list[Problem], pins: dict[int, str]) -> Walk:
    """Walk the entries after `start` in id order; `pins`: seq -> hash some record expects."""
    walked = Walk(start)
    prev_hash, expected_id = start.hash, start.seq + 1
    q = (
        select(AuditEntry.__table__)
        .where(AuditEntry.id > start.seq)
        .order_by(AuditEntry.id)
        .execution_options(yield_per=BATCH)
    )
    for row in s.execute(q):
        walked.entries += 1
        if row.id != expected_id:
            problems.append(Problem(f"entries {expected_id}..{row.id - 1} missing (deleted)", row.id))
        # An entry keeps a tag of the previous hash and hashes over the previous entry's
        # own hash, so behind a broken link its hash cannot be checked on its own.
        linked = row.prev_hash == prev_hash[: audit.LINK_TAG]
        if not linked:
            problems.append(
                Problem(
                    "link broken: prev_hash does not match the entry before it "
                    "(an entry was deleted, inserted or reordered)",
                    row.id,
                )
            )
        if linked and row.hash != audit.entry_hash(prev_hash, row._mapping):
            problems.append(Problem("content edited: hash does not match the entry", row.id))
        pinned = pins.get(row.id)
        if pinned is not None and pinned != row.hash:
            problems.append(Problem("entry differs from the checkpoint recorded at it", row.id))
        try:
            json.loads(row.payload_json)
        except ValueError:
            problems.append(Problem("payload is not JSON", row.id))
        _take_refs(row.id, row.rows_json, walked, problems)
        prev_hash, expected_id = row.hash, row.id + 1
        walked.end = Head(row.id, row.hash)
    return walked


def _take_refs(entry: int, rows_json: str, walked: Walk, problems: list[Problem]) -> None:
    if rows_json == "[]":
        return
    try:
        refs = json.loads(rows_json)
        for table, key, digest in refs:
            if table not in COVERED:
                problems.append(Problem(f"covers a row of a table that is not history: {table}", entry))
                continue
            raw = audit.digest_bytes(digest)
            earlier = walked.refs[table].add(key, raw, entry)
            if earlier is not None:
                problems.append(Problem(f"row covered twice (first by entry {earlier})", entry, table, key))
    except (ValueError, TypeError):
        problems.append(Problem("rows_json is not a list of [table, key, digest]", entry))
