"""Reading the files a person gives us, refused by name when unsafe or malformed."""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar, get_args

from pydantic import TypeAdapter, ValidationError

from anvil_ctl.core.errors import AnvilError, BadInput, ConfigError

T = TypeVar("T")

MAX_INPUT_BYTES = 1 << 20
"""Host configs, recipes and profiles are a few KiB; a larger file is a mistake."""

MAX_NESTING = 16
"""Arrays and tables nest at most this deep in our TOML files (ours use 3)."""


def read_input_file(
    path: Path,
    what: str,
    *,
    max_bytes: int = MAX_INPUT_BYTES,
    error: Callable[..., AnvilError] = ConfigError,
) -> str:
    """The text of a regular UTF-8 file of at most `max_bytes`; anything else is refused by `error`.

    Opened with O_NONBLOCK so that a FIFO swapped in after the check cannot hang us.
    """
    noun = what if what.endswith("file") else f"{what} file"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found", file=str(path)) from None
    except (OSError, ValueError) as exc:  # ELOOP, EACCES, ENOTDIR, ENAMETOOLONG; NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(f"{path}: {what} cannot be read: {reason}", file=str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory; expected a {noun}", file=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise error(
            f"{path}: is not a regular file (a FIFO, socket or device); expected a {noun}", file=str(path)
        )
    if st.st_size > max_bytes:
        raise error(f"{path}: {st.st_size} bytes; expected a {noun} of at most {max_bytes}", file=str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: {what} cannot be read: {exc.strerror or exc}", file=str(path)) from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than {max_bytes} bytes; expected a {noun}", file=str(path))
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise error(f"{path}: is UTF-16; expected a UTF-8 {noun}", file=str(path))
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a leading BOM dropped
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            f"expected a UTF-8 {noun}",
            file=str(path),
        ) from None


def load_toml(path: Path, what: str, error: Callable[..., AnvilError] = ConfigError) -> dict[str, object]:
    """A TOML file a person gave us, read by `read_input_file`; `error` names every problem (a
    syntax error, arrays or tables nested too deeply)."""
    text = read_input_file(path, what, error=error)
    try:
        data = tomllib.loads(text)
        too_deep = _depth(data) > MAX_NESTING
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}", file=str(path)) from None
    except RecursionError:
        too_deep = True
    if too_deep:
        raise error(f"{path}: nested more than {MAX_NESTING} levels deep; expected a {what}", file=str(path))
    return data


def _depth(value: object) -> int:
    """How deeply lists and dicts nest in `value` (iteratively: no recursion limit to hit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        deepest = max(deepest, level if isinstance(item, dict | list) else level - 1)
        todo.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def format_validation_error(path: Path, exc: ValidationError) -> str:
    """One line per problem: file, dotted key, what was expected."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{path}: {key}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def validated(shape: type[T], data: object, source: str) -> T:
    """`data` as `shape` (pydantic models or dataclasses, in lists); BadInput names the file, the
    first problem's field as `gates[1].key` and what was expected."""
    try:
        return TypeAdapter(shape).validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        where = field_path("", loc)
        problem = first["msg"].removeprefix("Value error, ").replace("Input should be", "expected", 1)
        if first["type"] == "missing":
            problem = "expected a value; the key is missing"
        elif first["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            problem = f"unknown key; expected some of {_keys(shape, loc[:-1])}"
        raise BadInput(f"{source}: {where}: {problem}", file=source, field=where) from None


def field_path(prefix: str, loc: Sequence[int | str]) -> str:
    """A pydantic error's location as our files name it: `gates[1].name`."""
    where = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return where.removeprefix(".") or "(top level)"


def _tables(shape: object) -> Iterator[dict[str, object]]:
    """The pydantic field maps of the models and dataclasses inside `shape` (lists, unions)."""
    found = getattr(shape, "__pydantic_fields__", None)
    if isinstance(found, dict):
        yield {name: f.annotation for name, f in found.items()}
    else:
        for arg in get_args(shape):
            yield from _tables(arg)


def _keys(shape: object, loc: Sequence[int | str]) -> list[str]:
    """The keys the table at `loc` of `shape` accepts."""
    for part in loc:
        if isinstance(part, str):
            shape = next(t[part] for t in _tables(shape) if part in t)
    return sorted(k for t in _tables(shape) for k in t)
