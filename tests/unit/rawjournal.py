"""Reading the audit journal with plain sqlite3, as someone who knows its storage format.

On SQLite a lean entry (migration 0010 on) stores `hash` as its 32 bytes and `rows_json`
packed (`anvil_ctl.persistence.rowrefs`), and from 0011 on `at` and `tx_id` compactly
(`coltypes`), as history rows store their times (0013) and their container IDs, identity
digests and image IDs (0014, 0017), and from 0018 on its link tag, boot IDs and snapshot
references; `JournalRow` reads them as the hex and JSON
text the chain hashes, and every other value as stored. Use it as a connection's
`row_factory`: rows index by position and by name, unpack into a tuple and into a dict.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from anvil_ctl.persistence.coltypes import CompactTime, CompactUuid, HexDigest, ImageId, LinkTag
from anvil_ctl.persistence.rowrefs import unpack_rows

_SQLITE = sqlite_dialect()
_COMPACT = {
    "at": CompactTime(),
    "tx_id": CompactUuid(),
    "container_id": HexDigest(),
    "digest": HexDigest(),
    "image_id": ImageId(),
    "prev_hash": LinkTag(),
    "owner_boot_id": CompactUuid(),
    "boot_id": CompactUuid(),
    "sha256": HexDigest(),
    "before_sha256": HexDigest(),
    "after_sha256": HexDigest(),
}


def _decoded(name: str, value: object) -> object:
    if isinstance(value, bytes) and name == "hash" and len(value) == 32:
        return value.hex()
    if isinstance(value, bytes) and name in _COMPACT:
        return _COMPACT[name].process_result_value(value, _SQLITE)
    if isinstance(value, bytes) and name == "rows_json":
        return unpack_rows(value)
    return value


class JournalRow:
    def __init__(self, cursor: sqlite3.Cursor, raw: tuple[object, ...]) -> None:
        self._names = [d[0] for d in cursor.description]
        self._values = [_decoded(n, v) for n, v in zip(self._names, raw, strict=True)]

    def keys(self) -> list[str]:
        return list(self._names)

    def __getitem__(self, key: int | str) -> object:
        return self._values[key if isinstance(key, int) else self._names.index(key)]

    def __iter__(self) -> Iterator[object]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)
