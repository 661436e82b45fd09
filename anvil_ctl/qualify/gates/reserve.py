"""Post-workload VRAM reserve: a policy gate over readings from an injected probe.

The probe (`ReserveProbe`) returns `(GPU UUID, free MiB, reserve MiB)` per card;
the GPU side (NVML or simulated) lives in `anvil_ctl.gpu`, so this gate stays
decoupled. Classifications: `pass`, `below_reserve`, `not_measured`.
"""

from __future__ import annotations

import asyncio

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify.gates.base import Gate, GateContext
from anvil_ctl.qualify.results import GateResult


class VramReserve(Gate):
    """Every card keeps at least its reserve of free MiB after the workload."""

    gate_type = "vram_reserve"
    kind = "policy"

    def __init__(self, *, name: str | None = None, reserve_mib: int | None = None) -> None:
        super().__init__(name=name)
        self.reserve_mib = reserve_mib

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
