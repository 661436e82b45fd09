"""Column types that store a value more compactly than callers see it.

`PackedJSON`: a JSON body (a snapshot, a diff, a transaction's arguments, a step's
detail from migration 0012 on: `PackedDetail`) is
stored on SQLite as a compressed BLOB when that is smaller, behind a two-byte
tag: `00 79` from migration 0015 on (raw deflate against the preset dictionary
`jsondict.JSON_V1`, for bodies of `MIN_PACKED` bytes or more), `00 7a` before it (a zlib
stream, for bodies of 128 bytes or more), and both read back. Callers, the row digests of
`coverage` and `audit verify` see the same text either way, so a row's digest does not
depend on how it was stored, and rows written before migration 0008 (plain text) read as
they always did. PostgreSQL compresses large values itself (TOAST), and its TEXT columns
take no bytes: there the text is stored as it is.

Only columns that no operator view or README query reads with `json_extract` are
packed: a packed value reads as a BLOB in `sqlite3`.

The journal's compact columns (no view reads them): `HexDigest` (a hash as 32 bytes),
`CompactTime` (a `utcnow()` time as 8 bytes) and `CompactUuid` (a transaction ID as 16
bytes), each read back as the text it was given, which is what the entry's hash covers.
"""

from __future__ import annotations

import uuid
import zlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, LargeBinary, String, Text, case, func, type_coerce
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from anvil_ctl.persistence.jsondict import JSON_V1

if TYPE_CHECKING:
    from sqlalchemy.orm import QueryableAttribute

PACKED = b"\x00z"
"""The tag of a value packed before migration 0015: a zlib stream. No JSON text starts with
a NUL byte."""

PACKED_DICT = b"\x00y"
"""The tag of a value packed from migration 0015 on: raw deflate against `JSON_V1`."""

TAGS = (PACKED_DICT, PACKED)
"""Every packed form's tag, the one `pack` writes first."""

MIN_PACKED = 16
"""Below this many bytes of text, packing saves nothing worth a BLOB (`{}` stays text)."""


def _deflate(raw: bytes) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zdict=JSON_V1)
    return squeeze.compress(raw) + squeeze.flush()


def _inflate(data: bytes) -> bytes:
    inflate = zlib.decompressobj(-15, zdict=JSON_V1)
    raw = inflate.decompress(data) + inflate.flush()
    if not inflate.eof or inflate.unused_data:
        raise zlib.error("not one whole deflate stream")
    return raw


def is_packed(value: object) -> bool:
    """Whether a stored value is a packed JSON body (of either form)."""
    return isinstance(value, bytes) and value[:2] in TAGS


def pack(text: str) -> str | bytes:
    """`text` as stored on SQLite: the tagged deflate stream when smaller, else the text."""
    raw = text.encode()
    if len(raw) < MIN_PACKED:
        return text
    packed = PACKED_DICT + _deflate(raw)
    return packed if len(packed) < len(raw) else text


def unpack(value: str | bytes) -> str:
    """The text a stored value holds (plain text, or a packed BLOB of either form)."""
    if isinstance(value, str):
        return value
    tag, data = value[:2], value[2:]
    if tag == PACKED_DICT:
        return _inflate(data).decode()
    if tag == PACKED:
        return zlib.decompress(data).decode()
    raise ValueError("stored BLOB is not a packed JSON body")


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


class PackedDetail(PackedJSON):
    """A step's detail (`step_events.detail_json`), packed from migration 0012 on: the
    VRAM readings of `release-vram` and `vram-after-acceptance` are most of a step's bytes.
    `v_steps` shows the column as stored (a BLOB when packed); `audit show TX` decodes it."""

    cache_ok = True


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
            return digest_of(value)
        raise TypeError(f"digest column holds {type(value).__name__}")


def digest_of(stored: bytes) -> str:
    """The text of a digest `HexDigest` stored as bytes (what raw SQL reads back)."""
    return stored.hex()


UNREADABLE = "\x00 unreadable compact value"
"""What a compact column's BLOB that is not one of its forms reads as: no entry hashes it."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _micros(value: str) -> int | None:
    """Microseconds since the epoch of a `utcnow()` time, if it reads back as the same text."""
    try:
        when = datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
    delta = when - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros if micros >= 0 and _time_text(micros) == value else None


def _time_text(micros: int) -> str:
    return (_EPOCH + timedelta(microseconds=micros)).strftime(_TIME_FORMAT)


def time_of(stored: bytes) -> str:
    """The text of a time `CompactTime` stored as bytes (what raw SQL reads back)."""
    return _time_text(int.from_bytes(stored, "big")) if len(stored) == 8 else UNREADABLE


class CompactTime(TypeDecorator[str]):
    """A `utcnow()` time (27 characters), stored on SQLite as 8 bytes: microseconds since the
    epoch, big-endian. Callers see the text either way; a value that would not read back
    as the same text (and every value written before) is stored as text."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite":
            return value
        micros = _micros(value)
        return value if micros is None else micros.to_bytes(8, "big")

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return time_of(value)
        raise TypeError(f"time column holds {type(value).__name__}")


def uuid_of(stored: bytes) -> str:
    """The text of a transaction ID `CompactUuid` stored as bytes (what raw SQL reads back)."""
    return str(uuid.UUID(bytes=stored)) if len(stored) == 16 else UNREADABLE


class CompactUuid(TypeDecorator[str]):
    """A UUID in its 36-character text, stored on SQLite as its 16 bytes when it reads back
    as the same text (lowercase, hyphenated); any other value is stored as text."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite" or len(value) != 36:
            return value
        try:
            raw = uuid.UUID(value)
        except ValueError:
            return value
        return raw.bytes if str(raw) == value else value

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return uuid_of(value)
        raise TypeError(f"UUID column holds {type(value).__name__}")


IMAGE = "sha256:"
"""The prefix of a Docker image ID (`sha256:` and 64 hex digits)."""


def image_of(stored: bytes) -> str:
    """The text of an image ID `ImageId` stored as bytes (what raw SQL reads back)."""
    return IMAGE + stored.hex() if len(stored) == 32 else UNREADABLE


class ImageId(TypeDecorator[str]):
    """A Docker image ID (`sha256:` and 64 lowercase hex digits), stored on SQLite as the
    digest's 32 bytes (identities, from migration 0017 on); any other value is stored as
    text, and reads back as it was given either way."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite" or len(value) != len(IMAGE) + 64:
            return value
        if not value.startswith(IMAGE):
            return value
        try:
            raw = bytes.fromhex(value[len(IMAGE) :])
        except ValueError:
            return value
        return raw if IMAGE + raw.hex() == value else value

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return image_of(value)
        raise TypeError(f"image ID column holds {type(value).__name__}")


class LinkTag(TypeDecorator[str]):
    """A lean journal entry's `prev_hash`: the previous hash's first 8 hex digits
    (`audit.LINK_TAG`), stored on SQLite as their 4 bytes from migration 0018 on; any other
    value (the whole hash of an entry written before 0010) is stored as text, and reads back
    as it was given either way."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | bytes | None:
        if value is None or dialect.name != "sqlite" or len(value) != 8:
            return value
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return value
        return raw if raw.hex() == value else value

    def process_result_value(self, value: object, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return value.hex() if len(value) == 4 else UNREADABLE
        raise TypeError(f"link tag column holds {type(value).__name__}")


def starts_with_hex(
    column: ColumnElement[str] | QueryableAttribute[str], prefix: str, dialect: str
) -> ColumnElement[bool]:
    """`column` (a `HexDigest`: on SQLite its bytes from the migration that compacted it on,
    text before) starts with `prefix`, compared in SQL as text: exactly, not as a pattern."""
    if dialect == "sqlite":
        stored = type_coerce(column, LargeBinary)
        as_text = case((func.typeof(stored) == "blob", func.lower(func.hex(stored))), else_=stored)
        value = type_coerce(as_text, String)
    else:
        value = type_coerce(column, String)
    return func.substr(value, 1, len(prefix)) == prefix
