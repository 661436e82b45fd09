"""What an engine's log says: fatal and notice patterns per engine, and the classifier.

The pattern sets are data, one `LogPatterns` per engine name (the recipe's
`engine`): fatal patterns by class (traceback, CUDA error, OOM, NCCL error,
crash, engine error, restart) and notice patterns, each with the reason the line
is known to be non-fatal. Every engine gets the common fatal set; an engine
without its own set gets only that, and the evidence says so. The lines come
from what the engines really print: SGLang's scheduler and launcher, vLLM's
engine core and API server, NCCL's plugin probe, and the llama.cpp / llama-cpp-python
lines recorded in docs/ENGINES.md.

A line that matches a fatal pattern is fatal even when a notice pattern matches it
too: a notice may never hide a failure. An engine's start banner seen more than once
in one container's log is a restart of the engine inside the container (the runtime's
restart count catches a restart of the container itself).

Warning: matched lines are kept as evidence, so they are redacted first: explicit
secrets, and anything shaped like a credential (`api_key=...`, `Bearer ...`,
`--api-key X`, `hf_...`, `sk-...`). Engines do print their arguments at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from anvil_ctl.core.jsontypes import JSONObject

FatalKind = Literal["traceback", "cuda_error", "oom", "nccl_error", "crash", "engine_error", "restart"]
FATAL_KINDS: tuple[FatalKind, ...] = (
    "traceback",
    "cuda_error",
    "oom",
    "nccl_error",
    "crash",
    "engine_error",
    "restart",
)
KEEP_CHARS = 400
"""A kept line is cut to this many characters (a traceback line can be a megabyte of tensor)."""


@dataclass(frozen=True)
class FatalPattern:
    """A line that means the serve failed, of one class."""

    kind: FatalKind
    regex: str


@dataclass(frozen=True)
class NoticePattern:
    """A line known to be harmless, and why."""

    name: str
    regex: str
    reason: str


@dataclass(frozen=True)
class LogPatterns:
    """Everything the log audit knows of one engine's log."""

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


COMMON_FATAL: tuple[FatalPattern, ...] = (
    FatalPattern("traceback", r"Traceback \(most recent call last\)"),
    # OOM before CUDA error: "CUDA error: out of memory" is an OOM first.
    FatalPattern("oom", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    FatalPattern("oom", r"cudaMalloc failed: out of memory|\bOOM[- ]kill|Out of memory: Killed process"),
    FatalPattern("cuda_error", r"CUDA error\b|cudaError[A-Z]\w*|CUDA_ERROR_\w+|CUBLAS_STATUS_(?!SUCCESS)\w+"),
    FatalPattern("cuda_error", r"an illegal memory access was encountered|device-side assert triggered"),
    FatalPattern("nccl_error", r"NCCL error|nccl\w*Error\b|NCCL WARN .*(?:[Ff]ail|[Ee]rror|[Tt]imeout)"),
    FatalPattern("nccl_error", r"Watchdog caught collective operation timeout"),
    FatalPattern("crash", r"Segmentation fault|Fatal Python error|core dumped|\bSIGSEGV\b|\bSIGABRT\b"),
)
"""Every engine's fatal lines: Python tracebacks, CUDA and NCCL failures, OOM, crashes."""

NCCL_PLUGIN = NoticePattern(
    "nccl-plugin-absent",
    r"NCCL INFO (?:NET|PROFILER|TUNER)/Plugin: (?:Could not find|Plugin load returned|"
    r"Failed to find|No plugin found)",
    "optional NCCL plugin not installed; NCCL says it uses its internal network plugin instead",
)
TORCH_DEPRECATION = NoticePattern(
    "python-deprecation",
    r"\b(?:FutureWarning|DeprecationWarning|PendingDeprecationWarning)\b|\bis deprecated\b",
    "a Triton/Torch/library deprecation: it announces a future change and changes nothing now",
)

ENGINE_PATTERNS: dict[str, LogPatterns] = {
    "stub": LogPatterns(
        engine="stub",
        fatal=(FatalPattern("engine_error", r"anvil-stub: (?:fatal|error)\b"),),
        notices=(
            NoticePattern(
                "stub-notice",
                r"anvil-stub: notice\b",
                "the stub's planted notice line: informational by its contract (docs/CONTRACTS.md)",
            ),
            NCCL_PLUGIN,
            TORCH_DEPRECATION,
        ),
        start=r"anvil-stub: serving ",
    ),
    "sglang": LogPatterns(
        engine="sglang",
        fatal=(
            # Scheduler, TP worker and detokenizer failures are logged as "<Process> hit an
            # exception: <traceback>", then the child SIGQUITs the launcher.
            FatalPattern("engine_error", r"\b\w+ hit an exception\b"),
            FatalPattern("engine_error", r"Received sigquit from a child process"),
            FatalPattern("engine_error", r"Initialization failed\. warmup error"),
        ),
        notices=(NCCL_PLUGIN, TORCH_DEPRECATION),
        start=r"The server is fired up and ready to roll!",
    ),
    "vllm": LogPatterns(
        engine="vllm",
        fatal=(
            FatalPattern("engine_error", r"EngineCore (?:encountered a fatal error|failed to start)"),
            FatalPattern("engine_error", r"EngineDeadError|AsyncEngineDeadError"),
            FatalPattern("engine_error", r"Engine core initialization failed|WorkerProc hit an exception"),
        ),
        notices=(NCCL_PLUGIN, TORCH_DEPRECATION),
        start=r"Starting vLLM API server",
    ),
    "llama.cpp": LogPatterns(
        engine="llama.cpp",
        fatal=(
            FatalPattern("engine_error", r"llama_model_load: error loading model"),
            FatalPattern("engine_error", r"failed to load model|Failed to load model from file"),
            FatalPattern("engine_error", r"gguf_init_from_reader: invalid magic characters"),
            FatalPattern("engine_error", r"Model path does not exist"),
            FatalPattern("oom", r"ggml_\w+: failed to allocate|unable to allocate \w+ buffer"),
        ),
        notices=(
            NoticePattern(
                "mlock-failed",
                r"warning: failed to mlock|Try increasing RLIMIT_MEMLOCK",
                "mlock fails under Docker's RLIMIT_MEMLOCK and llama.cpp only warns: the model "
                "stays mapped, its pages may be paged out (docs/ENGINES.md)",
            ),
            TORCH_DEPRECATION,
        ),
        # uvicorn's line when llama-cpp-python's server process starts.
        start=r"Started server process \[",
    ),
}
ENGINE_ALIASES = {
    "llama-cpp-python": "llama.cpp",
    "llama-cpp": "llama.cpp",
    "llamacpp": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "sglang-sm120": "sglang",
}


def patterns_for(engine: str | None) -> LogPatterns:
    """The common fatal set plus the engine's own; an unknown engine gets the common set only."""
    name = (engine or "").strip().lower()
    own = ENGINE_PATTERNS.get(ENGINE_ALIASES.get(name, name))
    if own is None:
        return LogPatterns(engine=name or "unknown", fatal=COMMON_FATAL, known=False)
    return LogPatterns(
        engine=own.engine,
        fatal=(*COMMON_FATAL, *own.fatal),
        notices=own.notices,
        start=own.start,
    )


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


# -- the classifier ----------------------------------------------------------------------------


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
        """Engine restarts inside the container: start banners after the first."""
        return max(0, len(self.starts) - 1)

    def as_dict(self) -> JSONObject:
        return {
            "lines": self.lines,
            "fatal_counts": dict(self.fatal_counts),
            "fatal_lines": list(self.fatal),
            "notices": {
                name: {"reason": n.reason, "count": n.count, "examples": list(n.examples)}
                for name, n in self.notices.items()
            },
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
    """Classify each line: fatal (first matching class), notice, start banner or other.

    Counts are complete; at most `keep` lines are kept per fatal class and per notice,
    redacted and cut to KEEP_CHARS.
    """
    fatal = [(p.kind, p.regex, re.compile(p.regex)) for p in patterns.fatal]
    notices = [(n, re.compile(n.regex)) for n in patterns.notices]
    start = re.compile(patterns.start) if patterns.start else None
    out = LogClassification(lines=len(lines))
    for number, line in enumerate(lines, start=1):
        hit = next(((kind, regex) for kind, regex, rx in fatal if rx.search(line)), None)
        if hit is not None:
            kind, regex = hit
            count = out.fatal_counts.get(kind, 0)
            out.fatal_counts[kind] = count + 1
            if count < keep:
                out.fatal.append(
                    {"line": number, "kind": kind, "pattern": regex, "text": _keep(line, secrets)}
                )
            continue
        if start is not None and start.search(line):
            out.starts.append({"line": number, "text": _keep(line, secrets)})
            if len(out.starts) > 1:
                count = out.fatal_counts.get("restart", 0)
                out.fatal_counts["restart"] = count + 1
                if count < keep:
                    out.fatal.append(
                        {
                            "line": number,
                            "kind": "restart",
                            "pattern": patterns.start,
                            "text": _keep(line, secrets),
                        }
                    )
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
