"""Column types that store a value more compactly than callers see it.

`PackedJSON`: a large JSON body (a snapshot, a diff, a transaction's arguments) is
stored on SQLite as a zlib-compressed BLOB when that is smaller, behind a one-byte
tag; callers, the row digests of `coverage` and `audit verify` see the same text
either way, so a row's digest does not depend on how it was stored, and rows written
before migration 0008 (plain text) read as they always did. PostgreSQL compresses
large values itself (TOAST), and its TEXT columns take no bytes: there the text is
stored as it is.

Only columns that no operator view or README query reads with `json_extract` are
packed: a packed value reads as a BLOB in `sqlite3`.
"""

from __future__ import annotations

import zlib

from sqlalchemy import String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

PACKED = b"\x00z"
"""The tag of a packed value: no JSON text starts with a NUL byte."""

MIN_PACKED = 128
"""Below this many bytes of text, compression saves nothing worth a BLOB."""


def pack(text: str) -> str | bytes:
    """`text` as stored on SQLite: the tagged deflate stream when smaller, else the text."""
    raw = text.encode()
    if len(raw) < MIN_PACKED:
        return text
    packed = PACKED + zlib.compress(raw, 9)
    return packed if len(packed) < len(raw) else text


def unpack(value: str | bytes) -> str:
    """The text a stored value holds (plain text, or a packed BLOB)."""
    if isinstance(value, str):
        return value
    if not value.startswith(PACKED):
        raise ValueError("stored BLOB is not a packed JSON body")
    return zlib.decompress(value[len(PACKED) :]).decode()


class PackedJSON(TypeDecorator[str]):
    """JSON text, compressed at rest on SQLite when that is smaller (see the module doc)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite":
            return value
        return pack(value)

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if isinstance(value, str | bytes):
            return unpack(value)
        raise TypeError(f"packed JSON column holds {type(value).__name__}")


# -- the audit journal's compact columns ----------------------------------------------------------


class HexDigest(TypeDecorator[str]):
    """A SHA-256 in 64 lowercase hex digits, stored as its 32 bytes on SQLite.

    Callers see the hex text either way; an entry written before (hex text at rest) reads
    as it always did, so the value at rest says which form it is.
    """

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite" or len(value) != 64:
            return value
        raw = bytes.fromhex(value)
        return raw if raw.hex() == value else value  # only lowercase hex round-trips

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return value.hex()
        raise TypeError(f"digest column holds {type(value).__name__}")
