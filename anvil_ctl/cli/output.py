"""Where human output goes (`Out`), and the helpers every renderer shares.

Warning: every value shown may have come from a person or a file; every renderer passes each
one through `s` (escapes for control, bidi and invisible characters), so no record can steer
the terminal.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from anvil_ctl.cli.tables import layout, show_time
from anvil_ctl.core.validate import escape_text

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class Out:
    """stdout for one result."""

    width: int | None = None
    """The terminal's width; None on a pipe (nothing is narrowed there)."""
    wide: bool = False

    @cached_property
    def console(self) -> Console:
        from rich.console import Console

        return Console(highlight=False, markup=False, emoji=False, soft_wrap=True)

    @classmethod
    def stdout(cls, *, wide: bool = False) -> Out:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        return cls(width=width, wide=wide)

    @property
    def is_terminal(self) -> bool:
        return self.width is not None

    def line(self, text: str = "") -> None:
        """One line of text that is already safe (built from `s`)."""
        print(text, flush=False)

    def print(self, renderable: object) -> None:
        """A rich renderable (a summary table)."""
        self.console.print(renderable)

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> None:
        """Rows under a header of `columns`, fitted to the terminal (see `tables`)."""
        if not rows:
            self.line(f"{indent}(none)")
            return
        width = None if self.width is None else max(20, self.width - len(indent))
        cells = [[cell(v) for v in row] for row in rows]
        for text in layout([s(c) for c in columns], cells, width=width, wide=self.wide):
            self.line(indent + text)


def s(value: object) -> str:
    """A value as one safe line of text (see the module warning)."""
    return escape_text("" if value is None else str(value))


def cell(value: object) -> str:
    """A table cell: text as is, times to the second, lists joined, records as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(s(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, sort_keys=True)  # ensure_ascii: escaped by the encoder
    return show_time(s(value))


def scalar(value: object) -> str:
    """A value in a `key: value` line."""
    if isinstance(value, str):
        return show_time(s(value))
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return s(json.dumps(value, default=str, sort_keys=True))


def lines_of(data: Mapping[str, object], indent: str = "", skip: Sequence[str] = ()) -> list[str]:
    """A record as indented `key: value` lines; a nested record's keys one level deeper, a list
    of scalars joined, a list of records one `-` block each."""
    out: list[str] = []
    keys = [k for k in data if k not in skip]
    pad = max((len(s(k)) for k in keys), default=0)
    for key in keys:
        value = data[key]
        name = s(key)
        if isinstance(value, Mapping) and value:
            out.append(f"{indent}{name}:")
            out.extend(lines_of(value, indent + "  "))
        elif isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
            out.append(f"{indent}{name}:")
            for item in value:
                block = lines_of(item, indent + "    ")
                out.append(f"{indent}  - {block[0].lstrip()}" if block else f"{indent}  -")
                out.extend(block[1:])
        elif isinstance(value, list | tuple):
            out.append(f"{indent}{(name + ':').ljust(pad + 1)} {', '.join(scalar(v) for v in value) or '-'}")
        elif isinstance(value, Mapping):
            out.append(f"{indent}{(name + ':').ljust(pad + 1)} -")
        else:
            out.append(f"{indent}{(name + ':').ljust(pad + 1)} {scalar(value)}")
    return out
