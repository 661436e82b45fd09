"""The bounded final log audit: the candidate's container log and its restart and OOM record.

Reads the newest `max_lines` lines (at most `max_bytes`) of the candidate
container's output since it was created, plus the runtime's restart count and
OOM flag, and classifies the lines with the patterns of the engine's profile
(`GateContext.engine`, through `anvil_ctl.qualify.logs`). Fails on any fatal line, on an engine restart (its
start banner seen twice) or a container restart, on an OOM kill, and on a
container that no longer runs. The caps, the window actually read and every
count go into the evidence, with the matched lines redacted.

Classifications: `pass`, `oom`, `restart`, `fatal_log_line`, `not_running`,
`not_measured` (no log source given).
"""

from __future__ import annotations

import asyncio

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import ContainerLog
from anvil_ctl.qualify.gates.base import Gate, GateContext
from anvil_ctl.qualify.logs import LogClassification, classify, patterns_for, patterns_of
from anvil_ctl.qualify.results import GateResult


class LogAudit(Gate):
    """No traceback, CUDA error, OOM, NCCL error, crash or restart in the candidate's log."""

    gate_type = "log_audit"
    kind = "functional"

    def __init__(
        self,
        *,
        name: str | None = None,
        max_lines: int = 20000,
        max_bytes: int = 8 * 1024 * 1024,
        keep_lines: int = 20,
        engine: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.keep_lines = keep_lines
        self.engine = engine

    async def run(self, gate_ctx: GateContext) -> GateResult:
        if gate_ctx.container_log is None:
            return self.result(False, "not_measured", {}, "no container log source given")
        reader = gate_ctx.container_log
        log = await asyncio.to_thread(reader, self.max_lines, self.max_bytes)
        # `engine` in the profile names an engine profile to use instead of the candidate's.
        patterns = patterns_for(self.engine) if self.engine else patterns_of(gate_ctx.engine)
        found = classify(log.lines, patterns, secrets=gate_ctx.secrets, keep=self.keep_lines)
        restarts = log.restart_count + found.restarts
        fatal_lines = sum(n for kind, n in found.fatal_counts.items() if kind != "restart")
        if log.oom_killed or found.fatal_counts.get("oom"):
            classification = "oom"
        elif restarts:
            classification = "restart"
        elif fatal_lines:
            classification = "fatal_log_line"
        elif log.status and log.status != "running":
            classification = "not_running"
        else:
            classification = "pass"
        evidence: JSONObject = {
            "window": {
                "since": "container creation (every run of the container)",
                "max_lines": log.max_lines,
                "max_bytes": log.max_bytes,
                "lines_read": len(log.lines),
                "bytes_read": log.bytes_read,
                "truncated": log.truncated,
            },
            "container": {
                "status": log.status,
                "restart_count": log.restart_count,
                "oom_killed": log.oom_killed,
                "started_at": log.started_at,
                "exit_code": log.exit_code,
            },
            "patterns": patterns.as_dict(),
            **found.as_dict(),
        }
        return self.result(classification == "pass", classification, evidence, _summary(found, log))


def _summary(found: LogClassification, log: ContainerLog) -> str:
    count = len(log.lines)
    window = f"{count} line{'' if count == 1 else 's'}{' (truncated)' if log.truncated else ''}"
    problems = [f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(found.fatal_counts.items())]
    if log.restart_count:
        problems.append(f"container restarted {log.restart_count}x")
    if log.oom_killed:
        problems.append("OOM-killed")
    if log.status and log.status != "running":
        problems.append(f"container {log.status}")
    notices = ", ".join(f"{name} x{n.count}" for name, n in sorted(found.notices.items()))
    tail = f"; non-fatal notices: {notices}" if notices else ""
    if problems:
        return f"{window}: " + ", ".join(problems) + tail
    return f"{window}: no traceback, restart, CUDA error or OOM" + tail
