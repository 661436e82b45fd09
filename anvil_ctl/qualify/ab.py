"""The matched A/B control: two arms of one checkpoint, the same capacity cells, a verdict by
boundaries declared before the run.

The arms run one after the other, never at once, and the order alternates per
repetition (A B, then B A, ...) so that drift of the host (heat, other load) hits
both arms equally. Per cell each arm's p50 decode, prefill and TTFT are compared;
`delta_pct` is always B relative to A. The faster arm by the profile's `select`
metric (mean of its per-cell deltas) is selected only if it stays inside every
protected boundary relative to the other arm; otherwise the verdict names each
violated boundary and selects nothing. A boundary that covers no measured cell is
violated too: an unmeasured protection protects nothing.

Profiles declare the boundaries (`anvil_ctl.qualify.profiles`):

    select = "decode_p50"
    [[boundaries]]
    metric = "prefill_p50"     # decode_p50 | prefill_p50 | ttft_p50
    min_delta_pct = -3.0       # the selected arm may be at most 3 % slower ...
    min_context = 122880       # ... at nominal contexts >= 120K
    reason = "long agent sessions wait on long-context prefill"

`declaration()` is written to the evidence, with its digest, before the first request.

`ab_declare.py` holds what is declared, `ab_compare.py` the comparison; their names are
re-exported here. This module measures: both arms' cells, alternating per repetition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.ab_compare import compare, pct
from anvil_ctl.qualify.ab_declare import METRICS, Arm, Boundary, Metric, declaration, parse_boundaries
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.capacity import Capacity, Repetition

__all__ = [
    "METRICS",
    "Arm",
    "Boundary",
    "Metric",
    "compare",
    "declaration",
    "measure",
    "parse_boundaries",
    "pct",
    "run_measure",
]


async def _max_model_len(client: EngineClient, served_model: str) -> int | None:
    cards = await client.models()
    card = next((c for c in cards if c.id == served_model), None)
    if card is None:
        raise BadInput(f"{client.base_url}: serves {[c.id for c in cards]}, not {served_model!r}")
    return card.max_model_len


async def measure(arms: Sequence[Arm], capacity: Capacity, *, request_timeout_s: float = 600.0) -> JSONObject:
    """Both arms' cells, alternating per repetition; returns each arm's raw cells and the order run."""
    a, b = arms
    async with (
        EngineClient(a.base_url, timeout_s=request_timeout_s) as ca,
        EngineClient(b.base_url, timeout_s=request_timeout_s) as cb,
    ):
        limits = [await _max_model_len(ca, a.served_model), await _max_model_len(cb, b.served_model)]
        ctxs = {
            "A": GateContext(client=ca, served_model=a.served_model, thinking=False, max_model_len=limits[0]),
            "B": GateContext(client=cb, served_model=b.served_model, thinking=False, max_model_len=limits[1]),
        }
        cells: dict[str, JSONArray] = {"A": [], "B": []}
        order: JSONArray = []
        for nominal in capacity.contexts:
            for conc in capacity.concurrency:
                too_long = [lim for lim in limits if lim and nominal > lim]
                if too_long and capacity.skip_above_max_model_len:
                    for arm in ("A", "B"):
                        cells[arm].append(
                            {"nominal_tokens": nominal, "concurrency": conc, "skipped": "above max_model_len"}
                        )
                    continue
                reps: dict[str, list[Repetition]] = {"A": [], "B": []}
                for rep in range(capacity.repetitions):
                    for arm in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                        started = time.time()
                        reps[arm].append(await capacity.repetition(ctxs[arm], nominal, conc, rep))
                        order.append(
                            {
                                "cell": f"{context_label(nominal)}/C{conc}",
                                "rep": rep + 1,
                                "arm": arm,
                                "at": started,
                            }
                        )
                for arm in ("A", "B"):
                    cells[arm].append(capacity.cell(nominal, conc, reps[arm]))
    return {"cells": {**cells}, "order": order}


def run_measure(arms: Sequence[Arm], capacity: Capacity, *, request_timeout_s: float = 600.0) -> JSONObject:
    """Synchronous `measure`, for callers that run no event loop."""
    return asyncio.run(measure(arms, capacity, request_timeout_s=request_timeout_s))
