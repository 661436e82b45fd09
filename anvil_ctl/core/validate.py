"""Checks of values that come from a person, a file or the environment, in one place. Pure.

Each returns the value or raises `ValueError` phrased to follow the caller's field name.
The bounds are generous: they refuse typos and hostile values at the edge in one line.
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from typing import TypeVar
from urllib.parse import urlsplit

from anvil_ctl.core.errors import BadInput

T = TypeVar("T")
R = TypeVar("R")

MAX_CONTEXT_TOKENS = 1 << 24
"""16,777,216 tokens: beyond any engine's context today (the largest serve 10M)."""

MAX_MIB = 1 << 24
"""16 TiB in MiB: more memory than any one GPU (or waiver value) will name."""

MAX_COUNT = 1_000_000
"""Listing limits, concurrencies and other counts."""

MAX_DURATION_S = 7 * 24 * 3600.0
"""A week: no timeout, deadline or poll interval of ours is longer."""

MAX_PERSON = 200
"""Characters in a person's name (--approved-by, --by)."""

MAX_TEXT = 2000
"""Characters in one free-text field (--reason, --note, a description)."""

MAX_TOKEN = 4096
"""Characters in a router token."""

# Characters that change how a terminal shows the text around them: bidi embeddings,
# overrides and isolates, and the marks that steer them (the Trojan Source set).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

_RFC3339_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z", re.ASCII)
_RFC3339_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?\Z", re.ASCII
)


def unsafe_char(value: str, *, multiline: bool = False) -> str | None:
    """The first character unsafe for a record or a terminal (controls, separators, bidi, invisible
    format characters), or None; `multiline` allows newline and tab.
    """
    for ch in value:
        if multiline and ch in "\n\t":
            continue
        if ch in BIDI_CONTROLS or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return ch
    return None


_CONTROL_NAMES = {
    0x00: "NUL",
    0x07: "bell",
    0x08: "backspace",
    0x09: "tab",
    0x0A: "line feed",
    0x0D: "carriage return",
    0x1B: "escape",
    0x7F: "delete",
}


def describe_char(ch: str) -> str:
    """`U+001B (escape)`: a character named for a message that must not contain it."""
    name = _CONTROL_NAMES.get(ord(ch)) or unicodedata.name(ch, "control character").lower()
    return f"U+{ord(ch):04X} ({name})"


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_text(value: str, *, keep_newlines: bool = False) -> str:
    """`value` with each unsafe character (and newline and tab unless `keep_newlines`) as an escape."""
    if value.isascii() and value.isprintable():
        return value  # the common case, fast
    out = []
    for ch in value:
        if keep_newlines and ch == "\n":
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif unsafe_char(ch) is not None:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def check_text(value: str, *, max_len: int = MAX_TEXT, multiline: bool = False, empty: bool = True) -> str:
    """Free text: no control, bidi or invisible format characters, at most `max_len` characters."""
    if not empty and not value.strip():
        raise ValueError("expected a non-empty value")
    if len(value) > max_len:
        raise ValueError(f"expected at most {max_len} characters (got {len(value)})")
    bad = unsafe_char(value, multiline=multiline)
    if bad is not None:
        raise ValueError(
            f"contains {describe_char(bad)}; expected text without control, bidi or invisible characters"
        )
    return value


def check_person(value: str) -> str:
    """A person's name as recorded (approver, resolver): non-empty, one line, bounded."""
    return check_text(value.strip(), max_len=MAX_PERSON, empty=False)


def check_token(value: str) -> str:
    """A bearer token: 1..MAX_TOKEN printable ASCII characters, no whitespace (sendable in a header)."""
    if not value:
        raise ValueError("expected a non-empty token")
    if len(value) > MAX_TOKEN:
        raise ValueError(f"expected at most {MAX_TOKEN} characters")
    for i, ch in enumerate(value):
        if not "\x21" <= ch <= "\x7e":
            what = "whitespace" if ch.isspace() else "a non-printable or non-ASCII character"
            raise ValueError(f"contains {what} at position {i}; expected printable ASCII without spaces")
    return value


def check_int(value: int, *, lo: int, hi: int) -> int:
    """An integer within [lo, hi] (bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer between {lo} and {hi}")
    if not lo <= value <= hi:
        raise ValueError(f"{value if abs(value) < 10**30 else 'a huge number'}: expected {lo}..{hi}")
    return value


def parse_int(value: str, *, lo: int, hi: int) -> int:
    """A whole number in ASCII digits alone (no sign, space or other script's digit) within [lo, hi]."""
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"{value[:40]!r}: expected a whole number in the digits 0-9")
    return check_int(int(value) if len(value) <= 30 else 10**30, lo=lo, hi=hi)


def check_duration(value: float, *, hi: float = MAX_DURATION_S) -> float:
    """A finite duration in seconds, > 0 and at most `hi`."""
    if not math.isfinite(value) or not 0 < value <= hi:
        raise ValueError(f"expected a finite number of seconds in (0, {hi:g}]")
    return float(value)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(value: str) -> float:
    """A duration as kubectl and helm write one (`90s`, `5m`, `1h30m`, `2m30.5s`, `500ms`) or
    plain seconds (`300`), in seconds: finite, > 0 and at most MAX_DURATION_S."""
    text = value.strip().lower()
    total = 0.0
    if re.fullmatch(r"\d+(\.\d+)?", text):
        total = float(text)
    elif text and _DURATION_PART.sub("", text) == "":
        unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        total = sum(float(n) * unit[u] for n, u in _DURATION_PART.findall(text))
    else:
        raise ValueError(f"{value[:40]!r}: expected a duration such as 90s, 5m, 1h30m or seconds")
    return check_duration(total)


def utc_stamp(when: datetime) -> str:
    """`when` as the database stores times (`2026-09-02T12:00:00.000000Z`), so strings compare."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 date (`2026-09-02`, midnight UTC) or date-time (`2026-09-02T12:00:00Z`,
    `...+02:00`; UTC when no offset is given), as an aware UTC datetime."""
    text = value.strip()
    try:
        if _RFC3339_DATE.match(text):
            return datetime.combine(date.fromisoformat(text), time(0, 0), tzinfo=UTC)
        if _RFC3339_TIME.match(text):
            frac = re.search(r"\.(\d+)", text)
            if frac and len(frac.group(1)) > 6:  # Python keeps microseconds; drop the rest
                text = text.replace(frac.group(0), "." + frac.group(1)[:6])
            when = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    except ValueError:
        pass
    raise ValueError(
        f"{value[:40]!r}: expected an RFC 3339 date (2026-09-02) or date-time (2026-09-02T12:00:00Z)"
    )


def split_binding(binding: str) -> tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT` -> (host without brackets, port)."""
    host, sep, port = binding.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{binding!r}: expected [IPv6]:PORT") from None
    elif ":" in host:
        raise ValueError(f"{binding!r}: an IPv6 address needs brackets, e.g. [::1]:8001")
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise ValueError(f"{binding!r}: expected HOST:PORT with a port in 1..65535")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (with or without brackets) and `localhost` are loopback."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return bare.lower() == "localhost"


def _shown(url: str) -> str:
    """A URL for a message: at most 60 characters, and never what stands before an `@`."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        url = f"{scheme}://…@{rest.rpartition('@')[2]}" if rest else "…@" + url.rpartition("@")[2]
    return repr(url[:60])


def check_url(value: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL with one of `schemes`, a host (except for unix:), a valid port and no credentials."""
    if unsafe_char(value) is not None or any(c.isspace() for c in value):
        raise ValueError(f"{_shown(value)}: expected a URL without spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError on a port out of range or not a number
    except ValueError:
        raise ValueError(f"{_shown(value)}: not a URL; expected {schemes[0]}://HOST:PORT") from None
    if parts.scheme not in schemes:
        raise ValueError(f"{_shown(value)}: expected a URL with scheme {' or '.join(schemes)}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a URL must not carry credentials; give tokens through the credential chain")
    if parts.scheme == "unix":
        if not parts.path.startswith("/"):
            raise ValueError(f"{_shown(value)}: expected unix:///absolute/path")
        return value
    if not parts.hostname:
        raise ValueError(f"{_shown(value)}: expected {parts.scheme}://HOST[:PORT]")
    if port == 0:
        raise ValueError(f"{_shown(value)}: expected a port in 1..65535")
    return value


def require(name: str, check: Callable[[T], R], value: T) -> R:
    """`check(value)`, with a ValueError turned into BadInput naming the flag or field `name`."""
    try:
        return check(value)
    except ValueError as exc:
        raise BadInput(f"{name}: {exc}", field=name.lstrip("-").replace("-", "_")) from None


def require_limit(limit: int) -> int:
    """A listing's `--limit`: 1 to MAX_COUNT, else BadInput naming `--limit`."""
    return require("--limit", lambda n: check_int(n, lo=1, hi=MAX_COUNT), limit)
