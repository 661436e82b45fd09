"""Where human output goes (`Out`), the helpers every renderer shares, and tables as kubectl
prints them: plain aligned columns that fit the terminal.

Too wide for a terminal, a table narrows: IDs elided in the middle (the resolvable prefix
kept), then text wrapped, then IDs to their prefix, then text narrower; times never break
and nothing is cut. On a pipe or with `-o wide` everything is in full.

Warning: every value shown may have come from a person or a file; every renderer passes each
one through `s` (escapes for control, bidi and invisible characters), so no record can steer
the terminal.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anvil_ctl.core.validate import escape_text


@dataclass
class Out:
    """stdout for one result (see `render.show`)."""

    width: int | None = None
    """The terminal's width; None on a pipe (nothing is narrowed there)."""
    wide: bool = False

    def line(self, text: str = "") -> None:
        """One line of text that is already safe (built from `s`)."""
        print(text, flush=False)

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


ID_RE = re.compile(r"^(sha256:)?[0-9a-f][0-9a-f-]{15,}$|^[a-z]{2,5}-[0-9a-f]{12,}$")
"""A transaction or container ID, a digest, a waiver ID (`wvr-0123456789ab`)."""
TIME_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]00:00)$")

ELLIPSIS = "…"
ID_HEAD = 8
"""Characters of an ID kept before the ellipsis: enough to resolve it as a prefix."""
ID_TAIL = 4
TEXT_MIN = 12
TEXT_FLOOR = 6
"""Text columns wrap to TEXT_MIN first; to TEXT_FLOOR only once IDs are down to their prefix."""
GAP = "  "


def show_time(value: str) -> str:
    """An RFC 3339 UTC time to the second, with `Z`."""
    m = TIME_RE.match(value)
    return f"{m.group(1)}Z" if m else value


def elide_middle(value: str, width: int) -> str:
    """`value` in `width` characters with the middle as `…`, keeping at least the first ID_HEAD
    characters after any `sha256:` (dropped last)."""
    if len(value) <= width:
        return value
    prefix = "sha256:" if value.startswith("sha256:") else ""
    body = value[len(prefix) :]
    room = width - len(prefix)
    if room >= ID_HEAD + 1 + ID_TAIL:
        return prefix + body[: room - 1 - ID_TAIL] + ELLIPSIS + body[-ID_TAIL:]
    if room >= ID_HEAD + 1:
        return prefix + body[:ID_HEAD] + ELLIPSIS
    return body[:ID_HEAD] + ELLIPSIS  # narrower still: the digest's own prefix, without `sha256:`


def _id_floor(values: Sequence[str], header: str, *, tail: bool, bare: bool = False) -> int:
    """The narrowest an ID column gets: its prefix, with or without tail and `sha256:`."""
    keep = ID_HEAD + 1 + (ID_TAIL if tail else 0)
    need = [min(len(v), (0 if bare or not v.startswith("sha256:") else 7) + keep) for v in values]
    return max([len(header), *need])


def _all_match(values: Sequence[str], pattern: re.Pattern[str]) -> bool:
    """A column of IDs (or times): every value present matches, and one is."""
    present = [v for v in values if v]
    return bool(present) and all(pattern.match(v) for v in present)


def layout(
    columns: Sequence[str], rows: Sequence[Sequence[str]], *, width: int | None, wide: bool = False
) -> list[str]:
    """The table's lines, fitted to `width` (None: no limit); cells are already safe text."""
    table = [[show_time(c) for c in row] for row in rows]
    natural = [max([len(h), *(len(r[i]) for r in table)]) for i, h in enumerate(columns)]
    widths = list(natural)
    if width is not None and not wide:
        widths = _fit(columns, table, widths, width)
    out = [_join([h.ljust(w) for h, w in zip(columns, widths, strict=True)])]
    for row in table:
        cells = [_cell_lines(value, w) for value, w in zip(row, widths, strict=True)]
        for n in range(max(len(c) for c in cells)):
            out.append(
                _join([(c[n] if n < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)])
            )
    return out


def _join(cells: list[str]) -> str:
    return GAP.join(cells).rstrip()


def _total(widths: Sequence[int]) -> int:
    return sum(widths) + len(GAP) * (len(widths) - 1)


def _fit(columns: Sequence[str], table: list[list[str]], widths: list[int], width: int) -> list[int]:
    """Column widths that fit `width` where they can; ID cells of `table` are elided in place."""
    values = [[r[i] for r in table] for i in range(len(columns))]
    ids = [i for i in range(len(columns)) if _all_match(values[i], ID_RE)]
    texts = [i for i in range(len(columns)) if i not in ids and not _all_match(values[i], TIME_RE)]

    def shrink_ids(tail: bool, bare: bool = False) -> None:
        for i in sorted(ids, key=lambda i: -widths[i]):
            excess = _total(widths) - width
            if excess <= 0:
                return
            widths[i] = max(_id_floor(values[i], columns[i], tail=tail, bare=bare), widths[i] - excess)

    def wrap_texts(floor: int) -> None:
        while _total(widths) > width:
            candidates = [i for i in texts if widths[i] > max(floor, len(columns[i]))]
            if not candidates:
                return
            i = max(candidates, key=lambda i: widths[i])
            widths[i] = max(floor, len(columns[i]), widths[i] - (_total(widths) - width))

    shrink_ids(tail=True)
    wrap_texts(TEXT_MIN)
    shrink_ids(tail=False)
    shrink_ids(tail=False, bare=True)
    wrap_texts(TEXT_FLOOR)
    # Whatever is still too wide, the terminal wraps: nothing is cut.
    for i in ids:
        for row in table:
            row[i] = elide_middle(row[i], widths[i])
    return widths


def _cell_lines(value: str, width: int) -> list[str]:
    if len(value) <= width:
        return [value]
    return textwrap.wrap(value, width, break_long_words=True, break_on_hyphens=False) or [""]
