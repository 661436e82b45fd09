"""Small helpers gates use to compare answers and to keep a list of named checks."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from anvil_ctl.core.jsontypes import JSONObject, JSONValue

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_EDGE = "`'\" \t\r\n."


def normalize(text: str) -> str:
    """Whitespace collapsed, surrounding quotes/backticks/periods removed."""
    return " ".join(text.split()).strip(_EDGE)


def same_text(observed: str, expected: str, *, case: bool = True) -> bool:
    a, b = normalize(observed), normalize(expected)
    return a == b if case else a.casefold() == b.casefold()


def strip_fence(text: str) -> str:
    text = text.strip()
    match = _FENCE.match(text)
    return match.group(1).strip() if match else text


def parse_json(text: str) -> tuple[bool, JSONValue]:
    """(True, value) when `text` (maybe in a code fence) is JSON, else (False, error)."""
    try:
        value: JSONValue = json.loads(strip_fence(text))
        return True, value
    except json.JSONDecodeError as exc:
        return False, str(exc)


def has_think_markup(text: str) -> bool:
    lowered = text.lower()
    return "<think>" in lowered or "</think>" in lowered


@dataclass
class Checks:
    """An ordered list of named checks; the first failed one classifies the gate."""

    items: list[JSONObject] = field(default_factory=list)

    def add(self, check: str, ok: bool, classification: str, **observed: JSONValue) -> bool:
        self.items.append({"check": check, "ok": ok, "classification": classification, **observed})
        return ok

    @property
    def passed(self) -> bool:
        return all(item["ok"] for item in self.items)

    @property
    def classification(self) -> str:
        for item in self.items:
            if not item["ok"]:
                return str(item["classification"])
        return "pass"

    @property
    def failed(self) -> list[str]:
        return [str(item["check"]) for item in self.items if not item["ok"]]
