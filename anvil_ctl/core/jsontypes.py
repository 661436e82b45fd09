"""JSON as it crosses the wire, the disk and the database, typed.

`JSONValue` is what `json.loads` can return and `json.dumps` can write; a
`JSONObject` is one JSON object. Code that reads a field narrows it where it
reads it (`isinstance`, or the helpers below, which raise a `ValueError` naming
the key), so that `mypy --strict` checks what is done with every value instead
of trusting it unchecked. Data with a known shape is a dataclass or a `TypedDict`;
these aliases are for documents whose shape is open (snapshots, evidence, step
results as stored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]
JSONArray: TypeAlias = list[JSONValue]
#: A read-only view of an object whose values are not narrowed yet.
JSONMapping: TypeAlias = Mapping[str, object]


def get_object(doc: Mapping[str, object], key: str) -> JSONObject:
    """`doc[key]` as an object ({} when absent); a ValueError when it is another type."""
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected a JSON object, got {type(value).__name__}")
    return value


def get_array(doc: Mapping[str, object], key: str) -> JSONArray:
    """`doc[key]` as an array ([] when absent); a ValueError when it is another type."""
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a JSON array, got {type(value).__name__}")
    return value


def get_str(doc: Mapping[str, object], key: str, default: str | None = None) -> str | None:
    """`doc[key]` as a string, `default` when absent or null; a ValueError for another type."""
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {type(value).__name__}")
    return value


def get_int(doc: Mapping[str, object], key: str, default: int | None = None) -> int | None:
    """`doc[key]` as an int (bool refused), `default` when absent or null."""
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: expected an integer, got {type(value).__name__}")
    return value


def get_float(doc: Mapping[str, object], key: str, default: float | None = None) -> float | None:
    """`doc[key]` as a float (ints accepted, bool refused), `default` when absent or null."""
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: expected a number, got {type(value).__name__}")
    return float(value)


def get_objects(doc: Mapping[str, object], key: str) -> list[JSONObject]:
    """`doc[key]` as an array of objects ([] when absent); a ValueError naming the key when
    it is another type or holds anything but objects."""
    out: list[JSONObject] = []
    for item in get_array(doc, key):
        if not isinstance(item, dict):
            raise ValueError(f"{key}: expected JSON objects, got {type(item).__name__}")
        out.append(item)
    return out
