"""Read a GGUF file's header and metadata, read-only, without any llama.cpp code.

Walks every key/value pair (arrays skipped) to prove the metadata intact; tensor data is
covered by the file's SHA-256. Bad bytes
raise `GgufError` naming the offset, nothing else.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"

# value type -> struct format of a scalar (strings and arrays are handled apart)
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # no metadata string is 16 MiB; a larger length means corrupt bytes
_MAX_COUNT = 1 << 32


class GgufError(ValueError):
    """The bytes are not a readable GGUF header."""


@dataclass(frozen=True)
class GgufHeader:
    version: int
    tensor_count: int
    metadata: dict[str, Any] = field(default_factory=dict)
    """Scalar and string values by key; arrays appear as `array[<count>]`."""


class _Reader:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.offset = 0

    def take(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise GgufError(f"cut at byte {self.offset + len(data)}: expected {n} more bytes")
        self.offset += n
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        size = self.unpack("<Q")
        if size > _MAX_STRING:
            raise GgufError(f"string of {size} bytes at byte {self.offset}: corrupt metadata")
        return self.take(size).decode("utf-8", errors="replace")

    def skip(self, n: int) -> None:
        self.fh.seek(n, 1)
        self.offset += n

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = self.unpack("<I")
            count = self.unpack("<Q")
            if count > _MAX_COUNT:
                raise GgufError(f"array of {count} items at byte {self.offset}: corrupt metadata")
            if item_kind in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item_kind]))
            else:
                for _ in range(count):
                    self.value(item_kind)
            return f"array[{count}]"
        raise GgufError(f"unknown value type {kind} at byte {self.offset}")


def read_header(path: Path) -> GgufHeader:
    """The header and metadata of the GGUF file at `path` (GgufError if it is not one)."""
    with path.open("rb") as fh:
        reader = _Reader(fh)
        magic = reader.take(4)
        if magic != MAGIC:
            raise GgufError(f"magic {magic!r}, expected {MAGIC!r}: not a GGUF file")
        version = reader.unpack("<I")
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version}: expected 2 or 3")
        tensors = reader.unpack("<Q")
        count = reader.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(count):
            key = reader.string()
            metadata[key] = reader.value(reader.unpack("<I"))
    return GgufHeader(version=version, tensor_count=tensors, metadata=metadata)
