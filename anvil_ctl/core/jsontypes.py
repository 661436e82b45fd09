"""JSON as it crosses the wire, the disk and the database, typed for `mypy --strict`.

For documents of open shape; the helpers narrow a field or raise a `ValueError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None
JSONObject: TypeAlias = dict[str, JSONValue]
JSONArray: TypeAlias = list[JSONValue]
#: A read-only view of an object whose values are not narrowed yet.
JSONMapping: TypeAlias = Mapping[str, object]


def plain(value: object) -> JSONValue:
    """A value of text, numbers and flags as JSON: tuples as lists, keys as text, anything else as str."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


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
    """`doc[key]` as an array of objects ([] when absent), else a ValueError naming the key."""
    out: list[JSONObject] = []
    for item in get_array(doc, key):
        if not isinstance(item, dict):
            raise ValueError(f"{key}: expected JSON objects, got {type(item).__name__}")
        out.append(item)
    return out


# Reading fields of evidence documents with the semantics of the plain expression each helper
# replaces: what that expression accepted is accepted, and what made it raise raises the same
# exception type.


def fields(value: object) -> JSONMapping:
    """`value` as a JSON object; anything else raises AttributeError, as `.get` on it did."""
    if isinstance(value, dict):
        return value
    raise AttributeError(f"{type(value).__name__!r} object has no attribute 'get'")


def items(value: object) -> list[object]:
    """The items of an array field, none when it is missing, null or empty (a string or an
    object iterates as characters or keys, which the caller skips or refuses)."""
    if not value:
        return []
    if isinstance(value, list | str | dict):
        return list(value)
    raise TypeError(f"{type(value).__name__!r} object is not iterable")


def whole(value: object) -> int:
    """`int(value)` of a JSON number or numeric string; TypeError for anything else."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"int() argument must be a string or a real number, not {type(value).__name__!r}")


def real(value: object) -> float:
    """`float(value)` of a JSON number or numeric string; TypeError for anything else."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not {type(value).__name__!r}")


def as_text(value: object) -> str:
    """A text field: a string as it is, a missing or empty value as "", any other as its str()."""
    if not value:
        return ""
    return value if isinstance(value, str) else str(value)


def number(value: object) -> float | None:
    """A figure to draw or print: a JSON number as it is, anything else None (not drawn)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def texts(value: object) -> list[str]:
    """The items of an array field as text, to join for display (none when missing or null)."""
    return [str(item) for item in items(value)]
