"""The log audit's view of an engine's log: its profile's patterns and the classifier. A fatal
pattern wins over a notice on the same line; a start banner seen twice is a restart. Kept lines are
redacted first (secrets, anything shaped like a credential): engines print their arguments at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from anvil_ctl.core.engine_profile import (
    COMMON_FATAL,
    EngineProfile,
    FatalPattern,
    NoticePattern,
    find_engine_profile,
)
from anvil_ctl.core.jsontypes import JSONObject

KEEP_CHARS = 400
"""A kept line is cut to this many characters (a traceback line can be a megabyte of tensor)."""


@dataclass(frozen=True)
class LogPatterns:
    """Everything the log audit knows of one engine's log (from its engine profile)."""

    engine: str
    fatal: tuple[FatalPattern, ...]
    notices: tuple[NoticePattern, ...] = ()
    start: str | None = None
    """The engine's start banner; seen twice in one container's log, the engine restarted."""
    known: bool = True
    """False: the engine has no set of its own; only the common fatal patterns apply."""

    def as_dict(self) -> JSONObject:
        return {
            "engine": self.engine,
            "known": self.known,
            "start": self.start,
            "fatal": [{"kind": p.kind, "regex": p.regex} for p in self.fatal],
            "notices": [{"name": n.name, "regex": n.regex, "reason": n.reason} for n in self.notices],
        }


def patterns_of(profile: EngineProfile) -> LogPatterns:
    """The common fatal set plus the profile's own patterns; only the common set (and
    `known` False) for a profile that knows nothing of its engine's log."""
    if not profile.own_log_patterns:
        return LogPatterns(engine=profile.name, fatal=COMMON_FATAL, known=False)
    return LogPatterns(
        engine=profile.name,
        fatal=profile.fatal_patterns,
        notices=profile.notice_log_patterns,
        start=profile.start_banner,
    )


def patterns_for(engine: str | None) -> LogPatterns:
    """The patterns of the engine profile `engine` names (aliases and case allowed); an
    engine without a profile gets the common set only, under its own name."""
    profile = find_engine_profile(engine)
    if profile is None:
        name = (engine or "").strip().lower()
        return LogPatterns(engine=name or "unknown", fatal=COMMON_FATAL, known=False)
    return patterns_of(profile)


# -- redaction ---------------------------------------------------------------------------------

_CREDENTIAL_RES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\bBearer\s+[^\s\"',]+"), "Bearer <redacted>"),
    (
        re.compile(
            r"(?i)(\b[\w.-]*(?:api[_-]?key|token|secret|password|passwd)[\w.-]*[\"']?\s*[:=]\s*[\"']?)"
            r"(?!<redacted>)[^\s\"',)}\]]+"
        ),
        r"\1<redacted>",
    ),
    (
        re.compile(r"(?i)(--[\w-]*(?:api-key|token|secret|password)[\w-]*[ =])(?!<redacted>)\S+"),
        r"\1<redacted>",
    ),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "<redacted>"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "<redacted>"),
)


def redact(line: str, secrets: Iterable[str] = ()) -> str:
    """The line without explicit secrets and without anything shaped like a credential."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        line = line.replace(secret, "<redacted>")
    for pattern, replacement in _CREDENTIAL_RES:
        line = pattern.sub(replacement, line)
    return line


@dataclass
class NoticeCount:
    reason: str
    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class LogClassification:
    """What the lines say: fatal lines by class (kept up to a limit), notices, start banners."""

    lines: int = 0
    fatal_counts: dict[str, int] = field(default_factory=dict)
    fatal: list[JSONObject] = field(default_factory=list)
    notices: dict[str, NoticeCount] = field(default_factory=dict)
    starts: list[JSONObject] = field(default_factory=list)
    other: int = 0

    @property
    def restarts(self) -> int:
        return max(0, len(self.starts) - 1)

    def as_dict(self) -> JSONObject:
        return {
            "lines": self.lines,
            "fatal_counts": dict(self.fatal_counts),
            "fatal_lines": list(self.fatal),
            "notices": {name: asdict(n) for name, n in self.notices.items()},
            "start_banners": list(self.starts),
            "engine_restarts": self.restarts,
            "other_lines": self.other,
        }


def _keep(line: str, secrets: Sequence[str]) -> str:
    text = redact(line, secrets)
    return text if len(text) <= KEEP_CHARS else text[:KEEP_CHARS] + "..."


def classify(
    lines: Sequence[str], patterns: LogPatterns, *, secrets: Sequence[str] = (), keep: int = 20
) -> LogClassification:
    """Classify each line: fatal (first matching class), notice, start banner or other. Counts are
    complete; at most `keep` lines are kept per class, redacted and cut to KEEP_CHARS."""
    fatal = [(p.kind, p.regex, re.compile(p.regex)) for p in patterns.fatal]
    notices = [(n, re.compile(n.regex)) for n in patterns.notices]
    start = re.compile(patterns.start) if patterns.start else None
    out = LogClassification(lines=len(lines))

    def fatal_line(number: int, kind: str, pattern: str | None, line: str) -> None:
        count = out.fatal_counts.get(kind, 0)
        out.fatal_counts[kind] = count + 1
        if count < keep:
            out.fatal.append({"line": number, "kind": kind, "pattern": pattern, "text": _keep(line, secrets)})

    for number, line in enumerate(lines, start=1):
        hit = next(((kind, regex) for kind, regex, rx in fatal if rx.search(line)), None)
        if hit is not None:
            fatal_line(number, *hit, line)
            continue
        if start is not None and start.search(line):
            out.starts.append({"line": number, "text": _keep(line, secrets)})
            if len(out.starts) > 1:
                fatal_line(number, "restart", patterns.start, line)
            continue
        notice = next((n for n, rx in notices if rx.search(line)), None)
        if notice is not None:
            seen = out.notices.setdefault(notice.name, NoticeCount(notice.reason))
            seen.count += 1
            if len(seen.examples) < min(keep, 3):
                seen.examples.append(_keep(line, secrets))
            continue
        out.other += 1
    return out
