"""What an A/B control declares before its first request: the arms, the metrics that can
select one, the protected boundaries (as a profile's `[[boundaries]]` give them) and the
declaration document, whose digest covers all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, real
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.gates.capacity import Capacity

Metric = Literal["decode_p50", "prefill_p50", "ttft_p50"]
METRICS: dict[str, tuple[str, bool]] = {
    "decode_p50": ("decode_tps_p50", True),
    "prefill_p50": ("prefill_tps_p50", True),
    "ttft_p50": ("ttft_s_p50", False),
}
"""metric -> (the capacity cell's key, whether higher is better)."""
_BOUNDARY_KEYS = {"metric", "min_delta_pct", "max_delta_pct", "min_context", "max_context", "reason"}


@dataclass(frozen=True)
class Boundary:
    """A protected boundary: the selected arm's delta on `metric` vs the other arm, per cell."""

    metric: str
    min_delta_pct: float | None = None
    max_delta_pct: float | None = None
    min_context: int = 0
    max_context: int | None = None
    reason: str = ""

    def applies(self, nominal: int) -> bool:
        return nominal >= self.min_context and (self.max_context is None or nominal <= self.max_context)

    def holds(self, delta: float | None) -> bool:
        if delta is None:
            return False
        if self.min_delta_pct is not None and delta < self.min_delta_pct:
            return False
        return self.max_delta_pct is None or delta <= self.max_delta_pct

    def describe(self) -> str:
        """As the issue writes it: `prefill_p50 >= -3 % at contexts >= 120K`."""
        parts = []
        if self.min_delta_pct is not None:
            parts.append(f"{self.metric} >= {self.min_delta_pct:g} %")
        if self.max_delta_pct is not None:
            parts.append(f"{self.metric} <= {self.max_delta_pct:+g} %")
        scope = []
        if self.min_context:
            scope.append(f">= {context_label(self.min_context)}")
        if self.max_context is not None:
            scope.append(f"<= {context_label(self.max_context)}")
        where = f" at contexts {' and '.join(scope)}" if scope else " at every context"
        return " and ".join(parts) + where

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "text": self.describe()}


def parse_boundaries(raw: object, source: str) -> tuple[Boundary, ...]:
    """`[[boundaries]]` of a profile; errors name the file and `boundaries[i].field`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadInput(
            f"{source}: boundaries: expected [[boundaries]] tables", file=source, field="boundaries"
        )
    out = []
    for i, item in enumerate(raw):
        where = f"{source}: boundaries[{i}]"
        if not isinstance(item, dict):
            raise BadInput(f"{where}: expected a table", file=source, field=f"boundaries[{i}]")
        unknown = sorted(set(item) - _BOUNDARY_KEYS)
        if unknown:
            raise BadInput(
                f"{where}.{unknown[0]}: unknown key; expected some of {sorted(_BOUNDARY_KEYS)}",
                file=source,
                field=f"boundaries[{i}].{unknown[0]}",
            )
        metric = item.get("metric")
        if metric not in METRICS:
            raise BadInput(
                f"{where}.metric: {metric!r}; expected one of {sorted(METRICS)}",
                file=source,
                field=f"boundaries[{i}].metric",
            )
        for key in ("min_delta_pct", "max_delta_pct"):
            value = item.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise BadInput(
                    f"{where}.{key}: expected a number of %", file=source, field=f"boundaries[{i}].{key}"
                )
        if item.get("min_delta_pct") is None and item.get("max_delta_pct") is None:
            raise BadInput(
                f"{where}: expected min_delta_pct or max_delta_pct", file=source, field=f"boundaries[{i}]"
            )
        for key in ("min_context", "max_context"):
            value = item.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise BadInput(
                    f"{where}.{key}: expected a number of tokens >= 0",
                    file=source,
                    field=f"boundaries[{i}].{key}",
                )
        out.append(
            Boundary(
                metric=str(metric),
                min_delta_pct=_float(item.get("min_delta_pct")),
                max_delta_pct=_float(item.get("max_delta_pct")),
                min_context=int(item.get("min_context") or 0),
                max_context=item.get("max_context"),
                reason=str(item.get("reason", "")),
            )
        )
    return tuple(out)


def _float(value: object) -> float | None:
    return None if value is None else real(value)


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
