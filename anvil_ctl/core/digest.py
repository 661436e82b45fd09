"""Canonical JSON (sorted keys, compact) and its SHA-256: the one form every digest is taken of."""

from __future__ import annotations

import hashlib
import json


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no insignificant whitespace: the form every digest is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(value: object) -> str:
    """SHA-256 of a value's canonical JSON (or of the bytes/str itself)."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = canonical_json(value).encode()
    return hashlib.sha256(data).hexdigest()
