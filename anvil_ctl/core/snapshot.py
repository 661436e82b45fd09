"""Snapshots: one canonical record of the live placement, its SHA-256, and a field-level diff.

The same schema serves a transaction's before and after and a recheck. Only
placement facts enter (container IDs and states, image IDs, served identities,
GPU owners, router tiers, residue); fluctuating readings such as free MiB go to
the transaction's step results instead, so that "the after-snapshot equals the
recorded one" is a meaningful statement. Secrets never enter a snapshot; where a
credential must be identified it enters as an HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from anvil_ctl.core.model import canonical_json, sha256_hex

SCHEMA_VERSION = 1


def normalize(value: Any) -> Any:
    """Canonical form: dict keys as str, tuples as lists, sets sorted, floats rounded."""
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(normalize(v) for v in value)
    if isinstance(value, float):
        return round(value, 6)
    return value


@dataclass(frozen=True)
class Snapshot:
    body: dict[str, Any]

    @classmethod
    def of(cls, body: dict[str, Any]) -> Snapshot:
        normalized = normalize(body)
        normalized["schema"] = SCHEMA_VERSION
        # A round trip through canonical JSON makes equal bodies equal objects.
        return cls(json.loads(canonical_json(normalized)))

    @property
    def canonical(self) -> str:
        return canonical_json(self.body)

    @property
    def sha256(self) -> str:
        return sha256_hex(self.canonical)


def secret_hmac(secret: str, key: bytes) -> str:
    """Identify a secret without storing it."""
    return "hmac-sha256:" + hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(value[key], f"{prefix}.{key}" if prefix else key, out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


@dataclass(frozen=True)
class Change:
    path: str
    before: Any
    after: Any

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "before": self.before, "after": self.after}


def diff(before: Snapshot, after: Snapshot) -> list[Change]:
    """Field-level differences, by dotted path; empty when the snapshots are equal."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(before.body, "", a)
    _flatten(after.body, "", b)
    missing = object()
    changes = []
    for path in sorted(set(a) | set(b)):
        va, vb = a.get(path, missing), b.get(path, missing)
        if va != vb:
            changes.append(Change(path, None if va is missing else va, None if vb is missing else vb))
    return changes
