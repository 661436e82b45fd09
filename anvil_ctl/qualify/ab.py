"""The matched A/B control: two arms of one checkpoint, the same capacity cells alternating per
repetition (A B, then B A) so host drift hits both; `delta_pct` is B against A. The faster arm by
the profile's `select` metric is selected only inside every boundary declared before the run (one
covering no measured cell is violated); `declaration()` goes to the evidence before any request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONArray, JSONMapping, JSONObject, get_float, get_int, whole
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.gates.base import GateContext
from anvil_ctl.qualify.gates.capacity import Capacity, Repetition
from anvil_ctl.qualify.profiles import METRICS, Boundary


@dataclass(frozen=True)
class Arm:
    """One arm: a loaded candidate reached at its own endpoint."""

    name: str
    base_url: str
    served_model: str
    identity: JSONObject
    """What binds the arm's cells to a serve: qualification digest, container, recipe."""


def declaration(
    arms: Sequence[Arm], capacity: Capacity, boundaries: Sequence[Boundary], select: str, profile: str
) -> JSONObject:
    """What is declared before the first request; `digest` covers all of it but itself."""
    body: JSONObject = {
        "profile": profile,
        "select": select,
        "boundaries": [b.as_dict() for b in boundaries],
        "capacity": capacity.thresholds(),
        "arms": [{"arm": label, **asdict(a)} for label, a in zip("AB", arms, strict=True)],
        "order": "A B in odd repetitions, B A in even ones",
    }
    return {**body, "digest": sha256_hex(body)}


async def _max_model_len(client: EngineClient, served_model: str) -> int | None:
    cards = await client.models()
    card = next((c for c in cards if c.id == served_model), None)
    if card is None:
        raise BadInput(f"{client.base_url}: serves {[c.id for c in cards]}, not {served_model!r}")
    return card.max_model_len


async def measure(arms: Sequence[Arm], capacity: Capacity) -> JSONObject:
    """Both arms' cells, alternating per repetition; returns each arm's raw cells and the order run."""
    a, b = arms
    async with (
        EngineClient(a.base_url) as ca,
        EngineClient(b.base_url) as cb,
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
                skipped = capacity.skipped(nominal, conc, *limits)
                if skipped is not None:
                    cells["A"].append(skipped)
                    cells["B"].append({**skipped})
                    continue
                reps: dict[str, list[Repetition]] = {"A": [], "B": []}
                cell = f"{context_label(nominal)}/C{conc}"
                for rep in range(capacity.repetitions):
                    for arm in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                        started = time.time()
                        reps[arm].append(await capacity.repetition(ctxs[arm], nominal, conc, rep))
                        order.append({"cell": cell, "rep": rep + 1, "arm": arm, "at": started})
                for arm in ("A", "B"):
                    cells[arm].append(capacity.cell(nominal, conc, reps[arm]))
    return {"cells": {**cells}, "order": order}


def run_measure(arms: Sequence[Arm], capacity: Capacity) -> JSONObject:
    """Synchronous `measure`, for callers that run no event loop."""
    return asyncio.run(measure(arms, capacity))


def _delta(arms: Mapping[str, JSONMapping], new: str, base: str, metric: str) -> float | None:
    """How much arm `new` differs from arm `base` on `metric`, in % of `base`'s (None when either
    is unknown)."""
    b, n = get_float(arms[base], metric), get_float(arms[new], metric)
    return None if n is None or b is None or b == 0 else (n - b) / b * 100.0


def _figures(cell: JSONMapping) -> JSONObject:
    """One arm's figures in one measured cell, as the comparison reads them: the p50 of each
    metric (`METRICS`), the prompt size and how many requests completed."""
    figures: JSONObject = {m: get_float(cell, key) for m, (key, _) in METRICS.items()}
    figures["prompt_tokens_p50"] = get_float(cell, "prompt_tokens_p50")
    figures["completed"] = get_int(cell, "completed")
    figures["requests"] = get_int(cell, "requests")
    return figures


@dataclass(frozen=True)
class _Row:
    """A cell both arms measured: each arm's figures and the delta (B vs A) per metric."""

    label: str
    nominal_tokens: int
    arms: dict[str, JSONObject]
    delta_pct: dict[str, float | None]


def compare(
    arms: Sequence[Arm],
    cells: Mapping[str, Sequence[JSONObject]],
    boundaries: Sequence[Boundary],
    select: str,
) -> JSONObject:
    """Per cell each arm's p50s and the delta (B vs A); the verdict by the declared boundaries."""
    names = {"A": arms[0].name, "B": arms[1].name}
    rows: JSONArray = []
    measured: list[_Row] = []
    for ca, cb in zip(cells["A"], cells["B"], strict=True):
        nominal = whole(ca["nominal_tokens"])
        label = f"{context_label(nominal)}/C{ca['concurrency']}"
        row: JSONObject = {
            "nominal_tokens": ca["nominal_tokens"],
            "concurrency": ca["concurrency"],
            "label": label,
        }
        if ca.get("skipped") or cb.get("skipped"):
            rows.append({**row, "skipped": ca.get("skipped") or cb.get("skipped")})
            continue
        by_arm = {"A": _figures(ca), "B": _figures(cb)}
        delta: dict[str, float | None] = {m: _delta(by_arm, "B", "A", m) for m in METRICS}
        measured.append(_Row(label, nominal, by_arm, delta))
        rows.append({**row, **by_arm, "delta_pct": {**delta}})
    return {
        "arms": {**names},
        "select": select,
        "cells": rows,
        "verdict": _verdict(names, measured, boundaries, select),
    }


def _unselected(outcome: str, summary: str) -> JSONObject:
    return {"outcome": outcome, "selected": None, "boundaries": [], "summary": summary}


def _verdict(
    names: dict[str, str], measured: list[_Row], boundaries: Sequence[Boundary], select: str
) -> JSONObject:
    failed = [
        f"{names[arm]} {r.label}: {(get_int(f, 'requests') or 0) - (get_int(f, 'completed') or 0)} failed"
        for r in measured
        for arm, f in r.arms.items()
        if f["completed"] != f["requests"]
    ]
    deltas = [r.delta_pct[select] for r in measured]
    if not measured or failed or any(d is None for d in deltas):
        why = "; ".join(failed) or ("no cell was measured" if not measured else f"{select} not measured")
        return _unselected("incomplete", f"no arm selected: {why}")
    score = sum(d for d in deltas if d is not None) / len(deltas)
    if score == 0:
        return _unselected("no-difference", f"{select}: no difference")
    b_better = score > 0 if METRICS[select][1] else score < 0
    winner, other = ("B", "A") if b_better else ("A", "B")
    checks: JSONArray = []
    held: list[str] = []
    violated: list[str] = []
    for boundary in boundaries:
        # Each covered cell: its label and the winner's delta vs the other arm.
        covered = [
            (r.label, _delta(r.arms, winner, other, boundary.metric))
            for r in measured
            if boundary.applies(r.nominal_tokens)
        ]
        holds = bool(covered) and all(boundary.holds(d) for _, d in covered)  # unmeasured protects nothing
        cells: JSONArray = [{"cell": c, "delta_pct": d, "holds": boundary.holds(d)} for c, d in covered]
        text = boundary.describe()
        checks.append({"boundary": text, "arm": names[winner], "cells": cells, "holds": holds})
        seen = ", ".join(f"{c} " + ("unmeasured" if d is None else f"{d:+.1f} %") for c, d in covered)
        seen = seen or "no measured cell is covered"
        held.append(f"{text} ({seen})")
        if not holds:
            violated.append(f"{text} violated ({seen})")
    lead = f"{names[winner]} is faster by {select} (mean {abs(score):+.1f} % vs {names[other]})"
    return {
        "outcome": "boundary-violated" if violated else "selected",
        "selected": None if violated else names[winner],
        "faster": names[winner],
        "boundaries": checks,
        "summary": f"{lead}, but {'; '.join(violated)}: no arm selected"
        if violated
        else f"{names[winner]} selected: {lead}; every declared boundary holds: "
        + ("; ".join(held) or "no boundary declared"),
    }
