"""Snapshots: one canonical record of the live placement, its SHA-256, and a structural diff.

Only placement facts enter (fluctuating readings go to step results), so equality of
snapshots is meaningful; no secrets. A diff is stored as a JSON Patch with a `test` of
every value it takes away.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from anvil_ctl.core.digest import canonical_json, sha256_hex
from anvil_ctl.core.jsontypes import JSONObject, JSONValue

SCHEMA_VERSION = 1


def normalize(value: object) -> object:
    """Canonical form: dict keys as str, tuples as lists, sets sorted (before normalizing), floats rounded."""
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if isinstance(value, set | frozenset):
        return [normalize(v) for v in sorted(value)]
    if isinstance(value, float):
        return round(value, 6)
    return value


@dataclass(frozen=True)
class Snapshot:
    body: JSONObject

    @classmethod
    def of(cls, body: Mapping[str, object]) -> Snapshot:
        normalized = {str(k): normalize(v) for k, v in body.items()}
        normalized["schema"] = SCHEMA_VERSION
        # A round trip through canonical JSON makes equal bodies equal objects.
        return cls(json.loads(canonical_json(normalized)))

    @property
    def canonical(self) -> str:
        return canonical_json(self.body)

    @property
    def sha256(self) -> str:
        return sha256_hex(self.canonical)


@dataclass(frozen=True)
class Change:
    """One difference: `add` (only after), `remove` (only before) or `replace` (both); absence is the op."""

    op: Literal["add", "remove", "replace"]
    parts: tuple[str | int, ...]
    before: JSONValue = None
    after: JSONValue = None

    @property
    def path(self) -> str:
        """As people read it: `router.backends[0]`, `gpu_owners.compute-a.container_id`."""
        out = ""
        for p in self.parts:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
        return out

    @property
    def pointer(self) -> str:
        """The JSON Pointer (RFC 6901, '~' and '/' escaped): `("router", 0)` -> `/router/0`."""
        return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in self.parts)

    def as_dict(self) -> JSONObject:
        out: JSONObject = {"op": self.op, "path": self.path, "pointer": self.pointer}
        if self.op != "add":
            out["before"] = self.before
        if self.op != "remove":
            out["after"] = self.after
        return out


def show_value(value: object) -> str:
    """A value as compact JSON: `null`, `[]`, `"text"` (absence is never a value)."""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False, default=str)


def _walk(a: JSONValue, b: JSONValue, parts: tuple[str | int, ...], out: list[Change]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                out.append(Change("remove", (*parts, key), before=a[key]))
            elif key not in a:
                out.append(Change("add", (*parts, key), after=b[key]))
            else:
                _walk(a[key], b[key], (*parts, key), out)
    elif isinstance(a, list) and isinstance(b, list):
        common = min(len(a), len(b))
        for i in range(common):
            _walk(a[i], b[i], (*parts, i), out)
        for i in range(common, len(b)):
            out.append(Change("add", (*parts, i), after=b[i]))
        # Highest index first, so that the patch applies in order (RFC 6902 shifts indexes).
        for i in reversed(range(common, len(a))):
            out.append(Change("remove", (*parts, i), before=a[i]))
    elif type(a) is not type(b) or a != b:  # bool is an int in Python (True == 1), not in JSON
        out.append(Change("replace", parts, before=a, after=b))


def diff(before: Snapshot, after: Snapshot) -> list[Change]:
    """What changed: whole subtrees added or removed, leaves replaced; empty when equal."""
    out: list[Change] = []
    _walk(before.body, after.body, (), out)
    return out


# -- JSON Patch (RFC 6902): how a diff is stored ----------------------------------------------


def to_patch(changes: list[Change]) -> list[JSONObject]:
    """The changes as a JSON Patch, each `remove`/`replace` preceded by a `test` of what it takes away."""
    ops: list[JSONObject] = []
    for c in changes:
        if c.op != "add":
            ops.append({"op": "test", "path": c.pointer, "value": c.before})
        if c.op == "remove":
            ops.append({"op": "remove", "path": c.pointer})
        else:
            ops.append({"op": c.op, "path": c.pointer, "value": c.after})
    return ops


def _parts(ptr: JSONValue) -> tuple[str | int, ...]:
    if not ptr:
        return ()
    if not isinstance(ptr, str) or not ptr.startswith("/"):
        raise ValueError(f"not a JSON pointer: {ptr!r}")
    # An all-digit token is shown as a list index; snapshot keys (names, hex IDs) are not numbers.
    return tuple(
        int(t) if t.isdigit() else t.replace("~1", "/").replace("~0", "~") for t in ptr[1:].split("/")
    )


def from_patch(ops: Sequence[Mapping[str, JSONValue]]) -> list[Change]:
    """The changes a patch written by `to_patch` describes (as read back: `json.loads` of a stored one)."""
    out: list[Change] = []
    tested: dict[str, JSONValue] = {}
    for op in ops:
        kind, ptr = op["op"], op["path"]
        if kind == "test":
            tested[str(ptr)] = op["value"]
        elif kind == "add":
            out.append(Change("add", _parts(ptr), after=op["value"]))
        elif kind == "remove":
            out.append(Change("remove", _parts(ptr), before=tested.pop(str(ptr), None)))
        elif kind == "replace":
            out.append(Change("replace", _parts(ptr), before=tested.pop(str(ptr), None), after=op["value"]))
        else:
            raise ValueError(f"JSON Patch op {kind!r} is not one a snapshot diff writes")
    return out
