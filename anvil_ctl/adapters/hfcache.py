"""Verify a pinned model in a Hugging Face hub cache, read-only; problems are reported, never raised.

Complete: `snapshots/<revision>` holds files, no `*.incomplete` blob, every entry resolves to a
regular file; pinned files match size, SHA-256 and (`.gguf`) header, read here without any
llama.cpp code: every metadata key/value is walked (arrays skipped) to prove it intact, and bad
bytes raise `GgufError` naming the offset. Warning: hashing reads every byte of every pinned file."""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import CacheReport, ModelFile, hub_repo_folder

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")


def parse_identity(identity: str) -> tuple[str, str]:
    """`org/name@<40 hex>` -> (repo_id, revision); BadInput otherwise."""
    repo_id, sep, revision = identity.partition("@")
    if not sep or not REPO_ID_RE.match(repo_id) or not REVISION_RE.match(revision):
        raise BadInput(
            f"model identity {identity!r}: expected ORG/NAME@<40 lowercase hex revision>",
            field="model",
        )
    return repo_id, revision


class HfCache:
    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def verify_files(self, identity: str, files: Sequence[ModelFile]) -> CacheReport:
        """`verify_identity` plus every pinned file's size, SHA-256 and (GGUF) header."""
        report = self.verify_identity(identity)
        if not files or not Path(report.snapshot_path).is_dir():
            return report
        problems = [
            *report.problems,
            *(p for pin in files for p in _check_file(Path(report.snapshot_path), pin)),
        ]
        return replace(report, complete=not problems, problems=tuple(problems))

    def verify_identity(self, identity: str) -> CacheReport:
        repo_id, revision = parse_identity(identity)
        repo_dir = self.cache_dir / hub_repo_folder(repo_id)
        snapshot = repo_dir / "snapshots" / revision
        problems: list[str] = []
        if not repo_dir.is_dir():
            problems.append(f"{repo_dir}: repository not in the cache")
        elif not snapshot.is_dir():
            problems.append(f"{snapshot}: revision {revision} not in the cache")
        else:
            problems.extend(_incomplete_blobs(repo_dir / "blobs"))
            count, entry_problems = _walk_snapshot(snapshot)
            problems.extend(entry_problems)
            if count == 0 and not entry_problems:
                problems.append(f"{snapshot}: snapshot holds no files")
        return CacheReport(repo_id, revision, str(snapshot), complete=not problems, problems=tuple(problems))


def _check_file(snapshot: Path, pin: ModelFile) -> list[str]:
    path = snapshot / pin.path
    if ".." in Path(pin.path).parts or Path(pin.path).is_absolute():
        return [f"{pin.path}: expected a path inside the snapshot"]
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [f"{pin.path}: pinned file not in the snapshot {snapshot}"]
    except OSError as exc:
        return [f"{pin.path}: cannot stat: {exc.strerror}"]
    if size != pin.size:
        return [f"{pin.path}: {size} bytes, expected the pinned {pin.size}"]
    try:
        with path.open("rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        return [f"{pin.path}: cannot read: {exc.strerror}"]
    if sha != pin.sha256:
        return [f"{pin.path}: SHA-256 {sha[:16]}… differs from the pinned {pin.sha256[:16]}…"]
    if pin.path.endswith(".gguf"):
        try:
            read_header(path)
        except (GgufError, OSError) as exc:
            return [f"{pin.path}: not a readable GGUF file: {exc}"]
    return []


def _incomplete_blobs(blobs: Path) -> list[str]:
    try:
        names = sorted(os.listdir(blobs))
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{blobs}: cannot list blobs: {exc.strerror}"]
    return [f"{blobs / n}: incomplete download" for n in names if n.endswith(".incomplete")]


def _walk_snapshot(snapshot: Path) -> tuple[int, list[str]]:
    """(count of resolved files, problems) of a snapshot directory."""
    count = 0
    problems: list[str] = []

    def on_error(exc: OSError) -> None:
        problems.append(f"{exc.filename}: cannot read: {exc.strerror}")

    # Snapshot subdirectories are real directories; only files are links into blobs.
    for root, dirs, files in os.walk(snapshot, onerror=on_error):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            rel = path.relative_to(snapshot)
            try:
                path.stat()  # follows the link into blobs
            except FileNotFoundError:
                target = os.readlink(path) if path.is_symlink() else "?"
                problems.append(f"{rel}: broken link -> {target}")
                continue
            except OSError as exc:
                problems.append(f"{rel}: cannot stat: {exc.strerror}")
                continue
            if path.is_dir():
                problems.append(f"{rel}: link to a directory, expected a file")
                continue
            count += 1
    return count, problems


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
