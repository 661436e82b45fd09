"""Paths into JSON evidence, as claims files write them.

Keys joined by `.`; `[3]` indexes a list (negative from its end), `[key=value,...]` picks
the one element whose fields equal those values (numbers compared as numbers). A path
that leads nowhere raises PathError saying where it stopped.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from anvil_ctl.core.jsontypes import JSONValue


class PathError(Exception):
    """A path that does not lead to a value (internal: becomes a claim's problem)."""


def _parts(path: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in path:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def resolve(data: JSONValue, path: str) -> JSONValue:
    """The value at `path` in `data` (see the module docstring); PathError says where it stops."""
    node = data
    walked = ""
    for part in _parts(path):
        match = re.fullmatch(r"([^\[\]]*)((?:\[[^\[\]]*\])*)", part)
        if match is None:
            raise PathError(f"{part!r} is not a key with optional [selectors]")
        name, selectors = match.groups()
        if name:
            if not isinstance(node, dict) or name not in node:
                raise PathError(f"no key {name!r} at {walked or 'the top'}")
            node = node[name]
            walked = f"{walked}.{name}" if walked else name
        for selector in re.findall(r"\[([^\[\]]*)\]", selectors):
            if not isinstance(node, list):
                raise PathError(f"{walked} is not a list")
            if re.fullmatch(r"-?\d+", selector):
                index = int(selector)
                if not -len(node) <= index < len(node):
                    raise PathError(f"{walked}[{index}] is out of range ({len(node)} elements)")
                node = node[index]
            else:
                wanted = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
                found = [
                    item
                    for item in node
                    if isinstance(item, dict) and all(_same(item.get(k), v) for k, v in wanted.items())
                ]
                if len(found) != 1:
                    raise PathError(f"{walked}[{selector}] matches {len(found)} elements, expected one")
                node = found[0]
            walked += f"[{selector}]"
    return node


def _same(value: object, text: str) -> bool:
    if isinstance(value, bool):
        return str(value).lower() == text.lower()
    if isinstance(value, int | float):
        try:
            return Decimal(str(value)) == Decimal(text)
        except InvalidOperation:
            return False
    return str(value) == text
