"""Gates that read the host: the VRAM reserve after the workload (a policy gate) and the bounded
final log audit (fatal lines, engine or container restarts, OOM, a stopped container).

Classifications: `pass`, `below_reserve`, `not_measured`, `oom`, `restart`, `fatal_log_line`,
`not_running`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import ContainerLog
from anvil_ctl.qualify.gates.base import Gate, GateContext
from anvil_ctl.qualify.logs import LogClassification, classify, patterns_for, patterns_of
from anvil_ctl.qualify.results import GateResult


@dataclass(kw_only=True, eq=False)
class VramReserve(Gate):
    """Every card keeps at least its reserve of free MiB after the workload."""

    gate_type = "vram_reserve"
    kind = "policy"

    reserve_mib: int | None = None

    async def run(self, gate_ctx: GateContext) -> GateResult:
        if gate_ctx.reserve_probe is None:
            return self.result(False, "not_measured", {"cards": []}, "no reserve probe given")
        # The probe may block (NVML, an HTTP read of a simulated GPU): keep the loop free.
        readings = await asyncio.to_thread(gate_ctx.reserve_probe)
        cards: list[JSONObject] = []
        for uuid, free_mib, reserve_mib in readings:
            required = reserve_mib if self.reserve_mib is None else self.reserve_mib
            cards.append(
                {
                    "uuid": uuid,
                    "free_mib": free_mib,
                    "reserve_mib": required,
                    "ok": free_mib >= required,
                    "margin_mib": free_mib - required,
                }
            )
        passed = bool(cards) and all(c["ok"] for c in cards)
        low = ", ".join(f"{c['free_mib']}<{c['reserve_mib']} MiB" for c in cards if not c["ok"])
        summary = "all cards keep their reserve" if passed else (low or "no cards read")
        classification = "below_reserve" if cards else "not_measured"
        return self.result(passed, classification, {"cards": [*cards]}, summary)


@dataclass(kw_only=True, eq=False)
class LogAudit(Gate):
    """No traceback, CUDA error, OOM, NCCL error, crash or restart in the candidate's log."""

    gate_type = "log_audit"
    kind = "functional"

    max_lines: int = 20000
    max_bytes: int = 8 * 1024 * 1024
    keep_lines: int = 20
    engine: str | None = None

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
        hits = {  # the first that holds classifies: an OOM outranks the restart it caused
            "oom": log.oom_killed or "oom" in found.fatal_counts,
            "restart": restarts > 0,
            "fatal_log_line": fatal_lines > 0,
            "not_running": bool(log.status) and log.status != "running",
        }
        classification = next((c for c, hit in hits.items() if hit), "pass")
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
