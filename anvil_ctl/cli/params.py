"""Parameter types of the command line: every argument checked before a command runs.

A value that fails its type is a usage error (exit 2, one line naming the flag)
raised while click parses, so it is refused before any database is opened, any
lock taken or any row written. The checks are `anvil_ctl.core.validate`'s; this
module only gives them click's shape. Light on purpose: `--help` imports it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click

from anvil_ctl.core.validate import (
    MAX_CONTEXT_TOKENS,
    MAX_COUNT,
    MAX_MIB,
    MAX_TEXT,
    check_person,
    check_text,
    parse_duration,
    parse_rfc3339,
    utc_stamp,
)


class Text(click.ParamType[str, object]):
    """One line (or, `multiline`, lines) of text without control, bidi or invisible characters."""

    name = "text"

    def __init__(self, max_len: int = MAX_TEXT, *, multiline: bool = False, empty: bool = False) -> None:
        self.max_len, self.multiline, self.empty = max_len, multiline, empty

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> str:
        try:
            return check_text(str(value), max_len=self.max_len, multiline=self.multiline, empty=self.empty)
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


class Person(click.ParamType[str, object]):
    """A person's name as recorded (approver, resolver): non-empty, one line, bounded."""

    name = "name"

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> str:
        try:
            return check_person(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


class Timestamp(click.ParamType[str, object]):
    """An RFC 3339 date or date-time, as the database writes times (UTC, microseconds, Z)."""

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> str:
        try:
            return utc_stamp(parse_rfc3339(str(value)))
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


class Duration(click.ParamType[float, object]):
    """A duration (`90s`, `5m`, `1h30m`, or seconds), as kubectl and helm take `--timeout`."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


class NewFile(click.ParamType[Path, object]):
    """A file we will (re)write, as text; `check_new_file` checks it on disk when the command
    runs (not while parsing, so that documented examples parse on any machine)."""

    name = "file"

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> Path:
        try:
            return Path(check_text(str(value), max_len=4096, empty=False))
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


def check_new_file(path: Path, flag: str) -> Path:
    """`path` may be (re)written: not a directory or a special file, in an existing, writable
    directory. Nothing is created to make it fit: a missing directory is a typo.
    click.BadParameter (exit 2) names `flag` otherwise."""

    def fail(message: str) -> click.BadParameter:
        return click.BadParameter(message, param_hint=f"'{flag}'")

    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise fail(f"{path} is a directory; expected a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise fail(f"{path} is not a regular file (a device, FIFO or socket)")
    parent = path.parent
    if not parent.is_dir():
        raise fail(f"directory {parent} does not exist (it is not created)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise fail(f"directory {parent} is not writable")
    return path


PERSON = Person()
REASON = Text(MAX_TEXT)
NOTE = Text(MAX_TEXT, multiline=True)
REF = Text(256)
"""An ID, prefix, name or digest that names a record or a container."""
RECIPE = Text(4096)
"""A recipe or profile: a name in its directory, or a path."""
SINCE = Timestamp()
TEXTFILE = NewFile()
CONTEXT_TOKENS = click.IntRange(1, MAX_CONTEXT_TOKENS)
MIB = click.IntRange(0, MAX_MIB)
LIMIT = click.IntRange(1, MAX_COUNT)
TIMEOUT = Duration()
