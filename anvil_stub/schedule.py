"""Faults that start late (`KIND[:VALUE]@ONSET`, ONSET `N` completions or `Ts` seconds): a serve
that degrades after its promotion is what a watch must catch. Standard library only.

| kind | VALUE | from its onset |
|---|---|---|
| `slow-first-token` | seconds | every completion waits VALUE seconds more before its first token |
| `slow-decode` | tokens/s | tokens after the first come at most VALUE per second |
| `http-500` | - | completions answer 500 `server_error` |
| `truncate-stream` | - | streamed completions stop halfway: no finish_reason, no `[DONE]` |
| `fatal-log` | - | one fatal line on stderr (`anvil-stub: fatal: ...`, the log audit's pattern) |
| `exit` | - | the engine exits with status 1, as a crash (after its Nth completion, or at T) |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VALUED = {"slow-first-token": "seconds", "slow-decode": "tokens/s"}
PLAIN = frozenset({"http-500", "truncate-stream", "fatal-log", "exit"})
KINDS = frozenset(VALUED) | PLAIN
FATAL_LINE = "anvil-stub: fatal: injected fault (fatal-log): engine core stopped responding"

_SPEC = re.compile(
    r"^(?P<kind>[a-z0-9-]+)(?::(?P<value>[0-9]+(?:\.[0-9]+)?))?@(?P<onset>[0-9]+(?:\.[0-9]+)?)(?P<s>s?)$"
)


class ScheduleError(ValueError):
    """A late fault's spelling is wrong; the message names the spec and what was expected."""


@dataclass(frozen=True)
class LateFault:
    kind: str
    value: float | None
    after_completions: int | None
    """The fault applies from completion number after_completions + 1 on (None: by time)."""
    after_s: float | None
    """The fault applies from this many seconds after the stub started (None: by count)."""

    def due(self, completions: int, elapsed_s: float) -> bool:
        """Whether the fault is on for a completion that `completions` others preceded, or at
        `elapsed_s` seconds since the start."""
        if self.after_completions is not None:
            return completions >= self.after_completions
        return self.after_s is not None and elapsed_s >= self.after_s


def parse_late_fault(spec: str) -> LateFault:
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ScheduleError(f"late fault {spec!r}: expected KIND[:VALUE]@N or KIND[:VALUE]@Ts")
    kind, value = m["kind"], m["value"]
    if kind not in KINDS:
        raise ScheduleError(f"late fault {spec!r}: unknown kind {kind!r}; known: {sorted(KINDS)}")
    if kind in VALUED and (value is None or float(value) <= 0):
        raise ScheduleError(f"late fault {spec!r}: {kind} needs a positive VALUE in {VALUED[kind]}")
    if kind in PLAIN and value is not None:
        raise ScheduleError(f"late fault {spec!r}: {kind} takes no VALUE")
    if m["s"]:
        return LateFault(kind, float(value) if value else None, None, float(m["onset"]))
    if "." in m["onset"]:
        raise ScheduleError(f"late fault {spec!r}: a count of completions is a whole number")
    return LateFault(kind, float(value) if value else None, int(m["onset"]), None)


@dataclass(frozen=True)
class Effects:
    """What the late faults due for one completion do to it."""

    extra_first_token_s: float = 0.0
    decode_tps_cap: float | None = None
    http_500: bool = False
    truncate: bool = False
    kinds: tuple[str, ...] = ()
    """The kinds due, as the completion's measured timing reports them."""


def effects(faults: tuple[LateFault, ...], completions: int, elapsed_s: float) -> Effects:
    """The effects on a completion that `completions` others preceded, at `elapsed_s`."""
    due = [f for f in faults if f.due(completions, elapsed_s)]
    caps = [f.value for f in due if f.kind == "slow-decode" and f.value]
    return Effects(
        extra_first_token_s=sum(f.value or 0.0 for f in due if f.kind == "slow-first-token"),
        decode_tps_cap=min(caps) if caps else None,
        http_500=any(f.kind == "http-500" for f in due),
        truncate=any(f.kind == "truncate-stream" for f in due),
        kinds=tuple(sorted({f.kind for f in due})),
    )
