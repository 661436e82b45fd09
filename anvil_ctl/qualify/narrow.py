"""Reading values out of JSON documents the way untyped code read them.

Each helper narrows an `object` read from a parsed document to what the reader
needs, with the semantics of the expression it replaces: `whole` is `int(value)`,
`real` is `float(value)`, `fields` is "call `.get` on it", `items` is "iterate it".
What that expression accepted is accepted; what made it raise raises the same
exception type, so typing a reader changes no outcome.
"""

from __future__ import annotations

from anvil_ctl.core.jsontypes import JSONMapping


def fields(value: object) -> JSONMapping:
    """`value` as a JSON object; anything else raises AttributeError, as `.get` on it did."""
    if isinstance(value, dict):
        return value
    raise AttributeError(f"{type(value).__name__!r} object has no attribute 'get'")


def items(value: object) -> list[object]:
    """The items of an array field, none when it is missing, null or empty.

    A string or an object iterates (characters, keys) as before, and the caller skips or
    refuses what it finds; any other value is not iterable, as before.
    """
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
