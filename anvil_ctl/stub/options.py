"""The stub engine's options: command-line flags, each with an `ANVIL_STUB_<OPTION>` env twin.

Flags win over env. Booleans in env accept 1/true/yes/on; the repeatable `--fault`
reads a comma-separated list from `ANVIL_STUB_FAULT`, the repeatable `--late-fault`
(`anvil_ctl.stub.schedule`) one from `ANVIL_STUB_LATE_FAULT`, the repeatable `--log-line` a
newline-separated one from `ANVIL_STUB_LOG_LINE` (a log line may hold commas).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anvil_ctl.stub.schedule import LateFault, ScheduleError, parse_late_fault

KNOWN_FAULTS = frozenset(
    {
        "bad-tool-args",
        "reasoning-leak",
        "truncate-stream",
        "bad-json",
        "no-reasoning",
        "ignore-max-tokens",
    }
)
ENV_PREFIX = "ANVIL_STUB_"


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

    @property
    def reported_name(self) -> str:
        """The model id this stub reports (the wrong one under --wrong-served-name)."""
        return self.wrong_served_name or self.served_model


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def env_default(option: str, fallback: object) -> object:
        return env.get(ENV_PREFIX + option.upper().replace("-", "_"), fallback)

    p = argparse.ArgumentParser(prog="python3 -m anvil_ctl.stub", description="anvil stub engine")
    p.add_argument("--host", default=env_default("host", "127.0.0.1"))
    p.add_argument("--port", type=int, default=env_default("port", 8000))
    p.add_argument("--served-model", default=env_default("served-model", "stub"))
    p.add_argument("--max-model-len", type=int, default=env_default("max-model-len", 32768))
    p.add_argument("--prefill-tps", type=float, default=env_default("prefill-tps", 0.0))
    p.add_argument("--decode-tps", type=float, default=env_default("decode-tps", 0.0))
    for flag in ("fail-health", "verbose-default"):
        fallback = _truthy(str(env_default(flag, "")))
        p.add_argument(f"--{flag}", action="store_true", default=fallback)
    p.add_argument("--exit-after", type=int, default=env_default("exit-after", None))
    p.add_argument("--slow-start", type=float, default=env_default("slow-start", 0.0))
    p.add_argument("--wrong-served-name", default=env_default("wrong-served-name", None))
    p.add_argument("--fault", action="append", default=None, help="repeatable")
    p.add_argument("--vram-idle-mib", type=int, default=env_default("vram-idle-mib", 0))
    p.add_argument("--vram-loaded-mib", type=int, default=env_default("vram-loaded-mib", None))
    p.add_argument("--vram-after-requests", type=int, default=env_default("vram-after-requests", 1))
    p.add_argument("--answer-book", default=env_default("answer-book", None))
    p.add_argument("--reasoning-tokens", type=int, default=env_default("reasoning-tokens", 16))
    p.add_argument("--default-max-tokens", type=int, default=env_default("default-max-tokens", 256))
    p.add_argument("--shm-file", action="append", default=None, help="repeatable")
    p.add_argument("--shm-dir", default=env_default("shm-dir", "/dev/shm"))  # noqa: S108
    p.add_argument("--log-line", action="append", default=None, help="repeatable")
    p.add_argument("--log-after", type=int, default=env_default("log-after", 0))
    p.add_argument("--restart-after", type=int, default=env_default("restart-after", None))
    p.add_argument("--late-fault", action="append", default=None, help="repeatable: KIND[:VALUE]@N|Ts")
    return p


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> StubOptions:
    """Build the options from argv and env (the caller passes os.environ at the edge)."""
    parser = _parser(env)
    ns = parser.parse_args(list(argv))
    faults_raw: list[str] = ns.fault if ns.fault is not None else env.get(ENV_PREFIX + "FAULT", "").split(",")
    faults = frozenset(f.strip() for f in faults_raw if f.strip())
    unknown = faults - KNOWN_FAULTS
    if unknown:
        parser.error(f"unknown fault(s) {sorted(unknown)}; known: {sorted(KNOWN_FAULTS)}")
    shm_env = env.get(ENV_PREFIX + "SHM_FILE", "").split(",")
    shm_raw: list[str] = ns.shm_file if ns.shm_file is not None else shm_env
    shm_files = tuple(f.strip() for f in shm_raw if f.strip())
    bad = [f for f in shm_files if "/" in f or f in (".", "..")]
    if bad:
        parser.error(f"--shm-file takes a plain file name, not a path: {bad}")
    log_raw: list[str] = (
        ns.log_line if ns.log_line is not None else env.get(ENV_PREFIX + "LOG_LINE", "").split("\n")
    )
    late_raw: list[str] = (
        ns.late_fault if ns.late_fault is not None else env.get(ENV_PREFIX + "LATE_FAULT", "").split(",")
    )
    try:
        late = tuple(parse_late_fault(f) for f in late_raw if f.strip())
    except ScheduleError as exc:
        parser.error(str(exc))
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
    gpus = tuple(u.strip() for u in visible.split(",") if u.strip().startswith("GPU-"))
    return StubOptions(
        host=ns.host,
        port=int(ns.port),
        served_model=ns.served_model,
        max_model_len=int(ns.max_model_len),
        prefill_tps=float(ns.prefill_tps),
        decode_tps=float(ns.decode_tps),
        fail_health=bool(ns.fail_health),
        exit_after=int(ns.exit_after) if ns.exit_after not in (None, "") else None,
        slow_start=float(ns.slow_start),
        wrong_served_name=ns.wrong_served_name or None,
        faults=faults,
        vram_idle_mib=int(ns.vram_idle_mib),
        vram_loaded_mib=int(ns.vram_loaded_mib) if ns.vram_loaded_mib not in (None, "") else None,
        vram_after_requests=int(ns.vram_after_requests),
        answer_book=ns.answer_book or None,
        reasoning_tokens=int(ns.reasoning_tokens),
        verbose_default=bool(ns.verbose_default),
        default_max_tokens=int(ns.default_max_tokens),
        gpu_uuids=gpus,
        shm_files=shm_files,
        shm_dir=ns.shm_dir,
        log_lines=tuple(line for line in log_raw if line.strip()),
        log_after=int(ns.log_after),
        restart_after=int(ns.restart_after) if ns.restart_after not in (None, "") else None,
        late_faults=late,
    )
