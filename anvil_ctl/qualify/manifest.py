"""The evidence manifest: how artifacts are encoded and listed, and how a listing is read.

Layout: `<evidence_dir>/<tx_id>/<artifact>.json` plus `manifest.json` listing every
artifact with its SHA-256 and size. `read_manifest` refuses anything that is not a
manifest (BadInput), entry by entry, before anyone trusts a listed path.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from anvil_ctl.config.inputs import read_input_file
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import unsafe_char

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
GPU_UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 16 << 20
MAX_ARTIFACT_BYTES = 1 << 40


def to_json(data: object) -> bytes:
    """The artifact encoding: sorted keys, two-space indent, UTF-8, trailing newline."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, default=str) + "\n").encode()


@dataclass(frozen=True)
class Artifact:
    """One file of evidence: its path relative to the transaction directory, hash and size."""

    path: str
    sha256: str
    size: int

    def as_dict(self) -> JSONObject:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


def artifact_of(root: Path, rel: str, data: bytes) -> Artifact:
    return Artifact(path=rel, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def read_manifest(directory: Path) -> JSONObject:
    """The manifest of an evidence directory, checked entry by entry (see `check_manifest`)."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: not a directory; expected an evidence directory", path=str(directory))
    path = directory / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"{directory}: no {MANIFEST}", path=str(directory))
    text = read_input_file(path, "evidence manifest file", max_bytes=MAX_MANIFEST_BYTES, error=BadInput)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON: {exc}", path=str(directory)) from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deeply; expected a manifest", path=str(directory)) from None
    return check_manifest(data, path)


def check_manifest(data: object, path: Path) -> JSONObject:
    """`data` if it is a manifest: an object whose `artifacts` list holds one object per file,
    each a distinct relative `path`, a 64-hex `sha256` and a `size` >= 0; BadInput otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("artifacts"), list):
        raise BadInput(f"{path}: expected an object with an 'artifacts' list", path=str(path))
    seen: set[str] = set()
    artifacts: list[object] = data["artifacts"]
    for i, entry in enumerate(artifacts):
        where = f"{path}: artifacts[{i}]"
        if not isinstance(entry, dict):
            raise BadInput(f"{where}: expected an object with path, sha256 and size", path=str(path))
        rel, digest, size = entry.get("path"), entry.get("sha256"), entry.get("size")
        if not isinstance(rel, str) or not rel or len(rel) > 4096 or unsafe_char(rel) is not None:
            raise BadInput(f"{where}.path: expected a relative file path", path=str(path))
        if rel in seen:
            raise BadInput(f"{where}.path: {rel!r} is listed twice", path=str(path))
        seen.add(rel)
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise BadInput(f"{where}.sha256: expected 64 lowercase hex digits", path=str(path))
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ARTIFACT_BYTES:
            raise BadInput(f"{where}.size: expected a number of bytes >= 0", path=str(path))
    return data


def listed_entries(manifest: JSONObject) -> list[JSONObject]:
    """The `artifacts` entries of a manifest `check_manifest` accepted: one object each."""
    entries = manifest["artifacts"]
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def manifest_sha256(directory: Path) -> str:
    """The SHA-256 of the directory's manifest file, as bytes on disk."""
    return hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()
