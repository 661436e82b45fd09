"""Log patterns as data: the classes of fatal lines, the common fatal set, shared notices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FatalKind = Literal["traceback", "cuda_error", "oom", "nccl_error", "crash", "engine_error", "restart"]


@dataclass(frozen=True)
class FatalPattern:
    """A log line that means the serve failed, of one class."""

    kind: FatalKind
    regex: str


@dataclass(frozen=True)
class NoticePattern:
    """A log line known to be harmless, and why."""

    name: str
    regex: str
    reason: str


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
PYTHON_DEPRECATION = NoticePattern(
    "python-deprecation",
    r"\b(?:FutureWarning|DeprecationWarning|PendingDeprecationWarning)\b|\bis deprecated\b",
    "a Triton/Torch/library deprecation: it announces a future change and changes nothing now",
)
