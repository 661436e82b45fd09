"""Parameter types of the command line: `anvil_ctl.core.validate`'s checks in click's shape.

A bad value is a usage error (exit 2, naming the flag) before any database, lock or row.
Light on purpose: `--help` imports it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from anvil_ctl.core.validate import (
    MAX_CONTEXT_TOKENS,
    MAX_COUNT,
    MAX_MIB,
    MAX_TEXT,
    check_person,
    check_text,
    parse_duration,
    parse_int,
    parse_rfc3339,
    utc_stamp,
)

T = TypeVar("T")


class Checked(click.ParamType[T, object]):
    """A parameter type made of one check of `core.validate`: its ValueError is the usage error."""

    def __init__(self, name: str, check: Callable[[str], T]) -> None:
        self.name, self._check = name, check

    def convert(self, value: object, param: click.Parameter | None, click_ctx: click.Context | None) -> T:
        try:
            return self._check(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, click_ctx)


def text(max_len: int = MAX_TEXT, *, multiline: bool = False) -> Checked[str]:
    """One line (or, `multiline`, lines) of text without control, bidi or invisible characters."""
    return Checked("text", lambda v: check_text(v, max_len=max_len, multiline=multiline, empty=False))


def check_new_file(path: Path, flag: str) -> Path:
    """`path` may be (re)written in an existing writable directory, else BadParameter naming `flag`."""

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


PERSON = Checked("name", check_person)
"""A person's name as recorded (approver, resolver): non-empty, one line, bounded."""
REASON = text()
NOTE = text(multiline=True)
REF = text(256)
"""An ID, prefix, name or digest that names a record or a container."""
RECIPE = text(4096)
"""A recipe or profile: a name in its directory, or a path."""
SINCE = Checked("time", lambda v: utc_stamp(parse_rfc3339(v)))
"""An RFC 3339 date or date-time, as the database writes times (UTC, microseconds, Z)."""
TEXTFILE = Checked("file", lambda v: Path(check_text(v, max_len=4096, empty=False)))
"""A file we will (re)write; `check_new_file` checks it on disk when the command runs (not
while parsing, so that documented examples parse on any machine)."""
CONTEXT_TOKENS = Checked("integer", lambda v: parse_int(v, lo=1, hi=MAX_CONTEXT_TOKENS))
MIB = Checked("integer", lambda v: parse_int(v, lo=0, hi=MAX_MIB))
LIMIT = Checked("integer", lambda v: parse_int(v, lo=1, hi=MAX_COUNT))
TIMEOUT = Checked("duration", parse_duration)
"""A duration (`90s`, `5m`, `1h30m`, or seconds), as kubectl and helm take `--timeout`."""
WATCH = Checked("duration", lambda v: 0.0 if v.strip() in ("0", "0s") else parse_duration(v))
"""`promote --watch`: a duration, or 0 for none."""
