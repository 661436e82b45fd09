"""The stub engine's options: command-line flags, each with an `ANVIL_STUB_<OPTION>` env twin.

Flags win over env; a repeatable flag's env twin is comma-separated (`ANVIL_STUB_LOG_LINE`'s one
line per item); the GPUs come from `NVIDIA_VISIBLE_DEVICES` as a real engine's do.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anvil_stub.schedule import LateFault, ScheduleError, parse_late_fault

KNOWN_FAULTS = frozenset(
    {"bad-tool-args", "reasoning-leak", "truncate-stream", "bad-json", "no-reasoning", "ignore-max-tokens"}
)
ENV_PREFIX = "ANVIL_STUB_"
REPEATED = {
    "faults": ("fault", ","),
    "shm_files": ("shm-file", ","),
    "log_lines": ("log-line", "\n"),
    "late_faults": ("late-fault", ","),
}
"""field -> (its repeatable flag, the separator of its env twin)"""


@dataclass(frozen=True)
class StubOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model: str = "stub"
    max_model_len: int = 32768
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    fail_health: bool = False
    exit_after: int | None = None
    slow_start: float = 0.0
    wrong_served_name: str | None = None
    faults: frozenset[str] = frozenset()
    vram_idle_mib: int = 0
    vram_loaded_mib: int | None = None
    vram_after_requests: int = 1
    answer_book: str | None = None
    reasoning_tokens: int = 16
    verbose_default: bool = False
    default_max_tokens: int = 256
    gpu_uuids: tuple[str, ...] = ()
    shm_files: tuple[str, ...] = ()
    shm_dir: str = "/dev/shm"  # noqa: S108 - the engine's own shared-memory directory
    log_lines: tuple[str, ...] = ()
    log_after: int = 0
    restart_after: int | None = None
    late_faults: tuple[LateFault, ...] = ()
    stop_timeout: float = 600.0
    """On SIGTERM, how long completions in flight may still run before the stub exits."""

    @property
    def reported_name(self) -> str:
        """The model id this stub reports (the wrong one under --wrong-served-name)."""
        return self.wrong_served_name or self.served_model


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> StubOptions:
    """Build the options from argv and env (the caller passes os.environ at the edge)."""
    parser = argparse.ArgumentParser(prog="python3 -m anvil_stub", description="anvil stub engine")
    for f in dataclasses.fields(StubOptions):
        if f.name == "gpu_uuids":
            continue
        if f.name in REPEATED:
            parser.add_argument(f"--{REPEATED[f.name][0]}", action="append", dest=f.name, help="repeatable")
            continue
        default = env.get(ENV_PREFIX + f.name.upper(), f.default)
        if isinstance(f.default, bool):
            truthy = str(default).strip().lower() in {"1", "true", "yes", "on"}
            parser.add_argument(f"--{f.name.replace('_', '-')}", action="store_true", default=truthy)
        else:
            kind = {"int | None": int, "str | None": str}.get(str(f.type)) or type(f.default)
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=default)
    values = vars(parser.parse_args(list(argv)))
    for name, (flag, separator) in REPEATED.items():
        twin = env.get(ENV_PREFIX + flag.upper().replace("-", "_"), "")
        raw = values[name] if values[name] is not None else twin.split(separator)
        values[name] = tuple(item.strip() if separator == "," else item for item in raw if item.strip())
    unknown = set(values["faults"]) - KNOWN_FAULTS
    if unknown:
        parser.error(f"unknown fault(s) {sorted(unknown)}; known: {sorted(KNOWN_FAULTS)}")
    bad = [f for f in values["shm_files"] if "/" in f or f in (".", "..")]
    if bad:
        parser.error(f"--shm-file takes a plain file name, not a path: {bad}")
    try:
        values["late_faults"] = tuple(parse_late_fault(f) for f in values["late_faults"])
    except ScheduleError as exc:
        parser.error(str(exc))
    for name in ("wrong_served_name", "answer_book"):
        values[name] = values[name] or None
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
    gpus = tuple(u.strip() for u in visible.split(",") if u.strip().startswith("GPU-"))
    return StubOptions(**{**values, "faults": frozenset(values["faults"]), "gpu_uuids": gpus})
