"""A snapshot body stored as a delta against an earlier one (from migration 0011 on).

A host's snapshots differ little from one transaction to the next (a container started,
another stopped), yet each new content was stored whole, ~1 KB compressed and growing
with the containers the host keeps. A new body is stored instead, when that is at most
half the size, as `{"base": SHA256, "zdelta": BASE64}`: the body's text deflated with
the base body's text as the preset dictionary (zlib's `zdict`), so only what differs
costs bytes. The base is always a body stored whole (a delta's base is never a delta:
reading one costs two inflations at most), and the delta is checked to inflate back to
the same text before it is stored.

The stored text is what the row's digest covers (`coverage`), like any other value;
a snapshot body is JSON with a `schema` member, so a delta is never taken for one.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable

from anvil_ctl.core.jsontypes import JSONValue

KEYS = frozenset({"base", "zdelta"})


def encode(text: str, base_sha256: str, base_text: str) -> str | None:
    """`text` as a delta against `base_text`, or None when storing it whole is as good."""
    raw = text.encode()
    squeeze = zlib.compressobj(9, zdict=base_text.encode())
    data = squeeze.compress(raw) + squeeze.flush()
    if 2 * len(data) > len(zlib.compress(raw, 9)):
        return None
    delta = json.dumps(
        {"base": base_sha256, "zdelta": base64.b64encode(data).decode()}, separators=(",", ":")
    )
    return delta if decode(delta, lambda _sha: base_text) == text else None


def base_of(stored: str) -> str | None:
    """The base's SHA-256 if `stored` is a delta, else None (a body stored whole)."""
    if not stored.startswith('{"base":'):
        return None
    try:
        value: JSONValue = json.loads(stored)
    except ValueError:
        return None
    if isinstance(value, dict) and set(value) == KEYS and isinstance(value["base"], str):
        return value["base"]
    return None


def decode(stored: str, whole: Callable[[str], str]) -> str:
    """The body's text: `stored` itself, or the delta inflated against its base, whose text
    `whole(sha256)` returns as stored (whole). ValueError if the delta does not inflate."""
    base = base_of(stored)
    if base is None:
        return stored
    value = json.loads(stored)
    data = base64.b64decode(value["zdelta"], validate=True)
    try:
        inflate = zlib.decompressobj(zdict=whole(base).encode())
        return (inflate.decompress(data) + inflate.flush()).decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise ValueError(f"snapshot delta against {base[:12]} does not inflate: {exc}") from None
