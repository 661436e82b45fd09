"""The rows an audit entry covers, stored compactly on SQLite.

An entry's `rows_json` is the canonical JSON text `[[table, key, digest], ...]` (see
`coverage`), and the entry's hash covers that text. On SQLite a new entry stores it as
a BLOB tagged `00 72` ("r"), about half the size: per row one byte naming the table and
the kind of key, the key (a varint, a UUID's 16 bytes, a hex SHA-256's 32 bytes, or
UTF-8 text), and the digest's 32 bytes; tagged `00 73` ("s") when every digest is of 16
bytes (entries from migration 0011 on), and then 16 bytes each. Reading it back gives the same text, so the
hash, `audit verify` and anyone reading through `unpack_rows` see what was hashed; a
list that would not come back byte for byte (an unknown table, a hex digest of an
older entry) stays text, as every entry written before this did.

`TABLES` only ever grows at its end: a table's position is its code in every BLOB.
"""

from __future__ import annotations

import base64
import json
import uuid

from sqlalchemy import Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from anvil_ctl.core.digest import canonical_json

TAG = b"\x00r"
"""The tag of a packed list: no JSON text starts with a NUL byte."""
SHORT_TAG = b"\x00s"
"""The tag of a packed list whose digests are of 16 bytes (22 base64url characters)."""
_DIGEST_SIZE = {TAG: 32, SHORT_TAG: 16}
_TEXT_SIZE = {32: 43, 16: 22}

TABLES: tuple[str, ...] = (
    "transactions",
    "transaction_states",
    "step_events",
    "snapshots",
    "snapshot_diffs",
    "identities",
    "locks",
    "lock_releases",
    "gpu_ownership_events",
    "evidence",
    "decisions",
    "waivers",
    "waiver_revocations",
    "approvals",
    "rechecks",
    "shm_marks",
    "evidence_manifests",
    "audit_checkpoints",
    "snapshot_blobs",
    "identity_bodies",
    "hosts",
)
_CODE = {name: n for n, name in enumerate(TABLES)}

# the kind of key, in the low two bits of a row's first byte
_INT, _TEXT, _UUID, _HEX = 0, 1, 2, 3


UNREADABLE = "\x00 unreadable packed rows"
"""What a BLOB that is not a packed list reads as: no entry's hash covers it, and it is not JSON."""


class Unpackable(ValueError):
    """The list cannot be stored packed (it stays text)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, at


def _key(key: object) -> tuple[int, bytes]:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise Unpackable(f"key {key!r}")
    if isinstance(key, int):
        if key < 0:
            raise Unpackable(f"key {key!r}")
        return _INT, _varint(key)
    if len(key) == 36:
        try:
            as_uuid = uuid.UUID(key)
        except ValueError:
            as_uuid = None
        if as_uuid is not None and str(as_uuid) == key:
            return _UUID, as_uuid.bytes
    if len(key) == 64:
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            raw = b""
        if raw.hex() == key:
            return _HEX, raw
    text = key.encode()
    return _TEXT, _varint(len(text)) + text


def pack_rows(text: str) -> bytes:
    """The packed form of a `rows_json` text; `Unpackable` if it would not read back the same."""
    try:
        refs = json.loads(text)
    except ValueError:
        raise Unpackable("not JSON") from None
    if not isinstance(refs, list) or not refs:
        raise Unpackable("not a non-empty list")
    first = refs[0][2] if isinstance(refs[0], list) and len(refs[0]) == 3 else None
    tag = SHORT_TAG if isinstance(first, str) and len(first) == _TEXT_SIZE[16] else TAG
    width = _TEXT_SIZE[_DIGEST_SIZE[tag]]
    out = bytearray(tag)
    for ref in refs:
        if not isinstance(ref, list) or len(ref) != 3:
            raise Unpackable(f"ref {ref!r}")
        table, key, digest = ref
        code = _CODE.get(table) if isinstance(table, str) else None
        if code is None or not isinstance(digest, str) or len(digest) != width:
            raise Unpackable(f"ref {ref!r}")
        kind, key_bytes = _key(key)
        try:
            raw = base64.urlsafe_b64decode(digest + "=" * (-width % 4))
            if len(raw) != _DIGEST_SIZE[tag]:
                raise ValueError(digest)
        except ValueError:
            raise Unpackable(f"ref {ref!r}") from None
        out += bytes([code << 2 | kind]) + key_bytes + raw
    packed = bytes(out)
    if unpack_rows(packed) != text:
        raise Unpackable("does not read back as the same text")
    return packed


def unpack_rows(value: str | bytes) -> str:
    """The `rows_json` text a stored value holds (text as it is, or a packed BLOB)."""
    if isinstance(value, str):
        return value
    width = _DIGEST_SIZE.get(value[: len(TAG)])
    if width is None:
        raise ValueError("stored BLOB is not a packed row list")
    refs: list[list[str | int]] = []
    at = len(TAG)
    try:
        while at < len(value):
            head = value[at]
            at += 1
            table, kind = TABLES[head >> 2], head & 3
            key: str | int
            if kind == _INT:
                key, at = _read_varint(value, at)
            elif kind == _UUID:
                key, at = str(uuid.UUID(bytes=value[at : at + 16])), at + 16
            elif kind == _HEX:
                key, at = value[at : at + 32].hex(), at + 32
            else:
                size, at = _read_varint(value, at)
                key, at = value[at : at + size].decode(), at + size
            digest = value[at : at + width]
            if len(digest) != width:
                raise ValueError("truncated")
            at += width
            refs.append([table, key, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()])
    except (IndexError, ValueError, UnicodeDecodeError):
        raise ValueError("stored BLOB is not a packed row list") from None
    return canonical_json(refs)


class PackedRows(TypeDecorator[str]):
    """An entry's `rows_json`, packed at rest on SQLite when it reads back the same."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite" or value == "[]":
            return value
        try:
            return pack_rows(value)
        except Unpackable:
            return value

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if isinstance(value, str | bytes):
            try:
                return unpack_rows(value)
            except ValueError:
                return UNREADABLE  # not a list of rows: verify names the entry
        raise TypeError(f"rows column holds {type(value).__name__}")
