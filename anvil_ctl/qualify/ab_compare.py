"""The A/B comparison: per cell each arm's p50s and the delta (B vs A), and the verdict the
declared boundaries allow (see `anvil_ctl.qualify.ab` for the rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anvil_ctl.core.jsontypes import JSONArray, JSONMapping, JSONObject, whole
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.ab_declare import METRICS, Arm, Boundary


def pct(new: float | None, base: float | None) -> float | None:
    """How much `new` differs from `base`, in % of `base` (None when either is unknown)."""
    if new is None or base is None or base == 0:
        return None
    return (new - base) / base * 100.0


@dataclass(frozen=True)
class _ArmCell:
    """One arm's figures in one measured cell, as the comparison reads them."""

    p50: dict[str, float | None]
    """By metric name (`METRICS`)."""
    prompt_tokens_p50: float | None
    completed: int | None
    requests: int | None

    @classmethod
    def of(cls, cell: JSONMapping) -> _ArmCell:
        return cls(
            {m: _number(cell.get(key)) for m, (key, _) in METRICS.items()},
            _number(cell.get("prompt_tokens_p50")),
            _count(cell.get("completed")),
            _count(cell.get("requests")),
        )

    def as_dict(self) -> JSONObject:
        return {
            **self.p50,
            "prompt_tokens_p50": self.prompt_tokens_p50,
            "completed": self.completed,
            "requests": self.requests,
        }


@dataclass(frozen=True)
class _Row:
    """A cell both arms measured: each arm's figures and the delta (B vs A) per metric."""

    label: str
    nominal_tokens: int
    arms: dict[str, _ArmCell]
    delta_pct: dict[str, float | None]


def _number(value: object) -> float | None:
    """A p50 as the cell holds it; a non-number fails here, as the arithmetic on it did."""
    if value is None or isinstance(value, int | float):
        return value
    raise TypeError(f"expected a number, got {type(value).__name__}")


def _count(value: object) -> int | None:
    if value is None or isinstance(value, int):
        return value
    raise TypeError(f"expected a count, got {type(value).__name__}")


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
        by_arm = {"A": _ArmCell.of(ca), "B": _ArmCell.of(cb)}
        delta: dict[str, float | None] = {m: pct(by_arm["B"].p50[m], by_arm["A"].p50[m]) for m in METRICS}
        measured.append(_Row(label, nominal, by_arm, delta))
        rows.append({**row, "A": by_arm["A"].as_dict(), "B": by_arm["B"].as_dict(), "delta_pct": {**delta}})
    return {
        "arms": {**names},
        "select": select,
        "cells": rows,
        "verdict": _verdict(names, measured, boundaries, select),
    }


@dataclass(frozen=True)
class _Check:
    """One declared boundary held against the cells it covers."""

    boundary: str
    arm: str
    cells: list[tuple[str, float | None, bool]]
    """(cell label, the winner's delta vs the other arm, whether the boundary holds there)."""

    @property
    def holds(self) -> bool:
        # An unmeasured protection protects nothing.
        return bool(self.cells) and all(ok for _, _, ok in self.cells)

    def as_dict(self) -> JSONObject:
        return {
            "boundary": self.boundary,
            "arm": self.arm,
            "cells": [{"cell": c, "delta_pct": d, "holds": ok} for c, d, ok in self.cells],
            "holds": self.holds,
        }

    def observed(self) -> str:
        if not self.cells:
            return "no measured cell is covered"
        return ", ".join(f"{c} " + ("unmeasured" if d is None else f"{d:+.1f} %") for c, d, _ in self.cells)


def _verdict(
    names: dict[str, str], measured: list[_Row], boundaries: Sequence[Boundary], select: str
) -> JSONObject:
    failed = [
        f"{names[arm]} {r.label}: {_difference(r.arms[arm])} failed"
        for r in measured
        for arm in ("A", "B")
        if r.arms[arm].completed != r.arms[arm].requests
    ]
    deltas = [r.delta_pct[select] for r in measured]
    if not measured or failed or any(d is None for d in deltas):
        why = "; ".join(failed) or ("no cell was measured" if not measured else f"{select} not measured")
        return {
            "outcome": "incomplete",
            "selected": None,
            "boundaries": [],
            "summary": f"no arm selected: {why}",
        }
    score = sum(d for d in deltas if d is not None) / len(deltas)
    if score == 0:
        return {
            "outcome": "no-difference",
            "selected": None,
            "boundaries": [],
            "summary": f"{select}: no difference",
        }
    b_better = score > 0 if METRICS[select][1] else score < 0
    winner, other = ("B", "A") if b_better else ("A", "B")
    checks = []
    for boundary in boundaries:
        observed = []
        for r in measured:
            if boundary.applies(r.nominal_tokens):
                delta = pct(r.arms[winner].p50[boundary.metric], r.arms[other].p50[boundary.metric])
                observed.append((r.label, delta, boundary.holds(delta)))
        checks.append(_Check(boundary.describe(), names[winner], observed))
    lead = f"{names[winner]} is faster by {select} (mean {abs(score):+.1f} % vs {names[other]})"
    violated = [c for c in checks if not c.holds]
    if violated:
        named = "; ".join(f"{c.boundary} violated ({c.observed()})" for c in violated)
        return {
            "outcome": "boundary-violated",
            "selected": None,
            "faster": names[winner],
            "boundaries": [c.as_dict() for c in checks],
            "summary": f"{lead}, but {named}: no arm selected",
        }
    held = "; ".join(f"{c.boundary} ({c.observed()})" for c in checks) or "no boundary declared"
    return {
        "outcome": "selected",
        "selected": names[winner],
        "faster": names[winner],
        "boundaries": [c.as_dict() for c in checks],
        "summary": f"{names[winner]} selected: {lead}; every declared boundary holds: {held}",
    }


def _difference(arm: _ArmCell) -> int:
    """How many of an arm's requests in a cell failed (requests - completed)."""
    if arm.requests is None or arm.completed is None:
        raise TypeError("unsupported operand type(s) for -: a missing request count")
    return arm.requests - arm.completed
