"""The `[watch]` table of a qualification profile (the README's example shows every key): how a serve
on the route is sampled, and the thresholds it is held to by `recheck --slo` and a watched promote.
A relative threshold (`max_ratio`, `min_ratio`) is resolved against the serve's own qualification
(`QUALIFIED`: its capacity gate's smallest cell at concurrency 1) into the absolute limit recorded
and judged before the first sample: nothing is chosen after the fact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, number
from anvil_ctl.core.validate import parse_duration

FUNCTIONAL_METRIC = "functional_failed"
METRICS = {
    "ttft_p50_s": "seconds to the first token, median of a sample",
    "ttft_p95_s": "seconds to the first token, 95th percentile of a sample",
    "decode_tps_p50": "decode tokens per second after the first, median of a sample",
    "error_rate": "share of a sample's requests that failed (an HTTP error, a broken stream)",
    "finish_reason_missing": "share of a sample's answers that ended without a finish_reason",
    "restarts": "container restarts and OOM kills since the watch began (passive, docker inspect)",
    "container_down": "1 when the serve's container is not running, else 0 (passive)",
    "fatal_log_lines": "the engine's fatal log lines since the watch began (the log audit's patterns)",
    "router_errors": "the router's own count of the serve's failed answers since the watch began "
    "(passive: HAProxy's hrsp_5xx + eresp + econ of its server, smg's failed circuit-breaker "
    "outcomes of its worker from `router.metrics_url`; not judged where none is read)",
    FUNCTIONAL_METRIC: "the functional gate's checks failed in a sample: an exact tool call (its "
    "fixture rotating) and exact JSON (taken only when a threshold names this metric)",
}
QUALIFIED = {"ttft_p50_s": "ttft_s_p50", "ttft_p95_s": "ttft_s_p95", "decode_tps_p50": "decode_tps_p50"}
"""Metric -> the key of the capacity cell its relative thresholds are resolved against."""

BOUNDS = ("max", "min", "max_ratio", "min_ratio")
_WATCH_KEYS = {"duration", "interval_s", "requests", "max_tokens", "consecutive", "thresholds"}


@dataclass(frozen=True)
class Threshold:
    metric: str
    bound: str
    """One of BOUNDS: `max`/`min` absolute, `max_ratio`/`min_ratio` times the qualified value."""
    value: float

    @property
    def relative(self) -> bool:
        return self.bound.endswith("_ratio")

    def resolve(self, qualified: Mapping[str, float]) -> Limit:
        """The absolute limit this threshold means for a serve with these qualified values."""
        op = "max" if self.bound.startswith("max") else "min"
        if not self.relative:
            return Limit(self.metric, op, self.value, f"{self.bound} {self.value:g}")
        base = qualified.get(self.metric)
        if base is None:
            return Limit(self.metric, op, None, f"{self.bound} {self.value:g}: no qualified {self.metric}")
        return Limit(self.metric, op, base * self.value, f"{self.value:g} x qualified {base:.4g}")

    def as_dict(self) -> JSONObject:
        return {"metric": self.metric, self.bound: self.value}


@dataclass(frozen=True)
class Limit:
    """A threshold made absolute for one serve: `limit` None when its baseline is unknown (then
    it is reported, never judged)."""

    metric: str
    op: str
    limit: float | None
    source: str

    def holds(self, observed: float | None) -> bool | None:
        """Whether `observed` is within the limit; None when it cannot be judged."""
        if self.limit is None or observed is None:
            return None
        return observed <= self.limit if self.op == "max" else observed >= self.limit

    def as_dict(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def of(cls, data: Mapping[str, object]) -> Limit:
        """The limit `as_dict` wrote (a journaled watch declaration's)."""
        limit = data.get("limit")
        return cls(
            str(data["metric"]),
            str(data["op"]),
            float(limit) if isinstance(limit, int | float) else None,
            str(data.get("source", "")),
        )


@dataclass(frozen=True)
class WatchPolicy:
    duration_s: float = 0.0
    """How long `promote` watches when `--watch` is not given: 0, a cutover, unless declared."""
    interval_s: float = 30.0
    requests: int = 3
    max_tokens: int = 32
    consecutive: int = 3
    thresholds: tuple[Threshold, ...] = field(
        default_factory=lambda: (
            Threshold("ttft_p95_s", "max_ratio", 1.25),
            Threshold("decode_tps_p50", "min_ratio", 0.8),
            Threshold("error_rate", "max", 0.01),
            Threshold("finish_reason_missing", "max", 0.0),
            Threshold("restarts", "max", 0.0),
            Threshold("container_down", "max", 0.0),
            Threshold("fatal_log_lines", "max", 0.0),
        )
    )
    source: str = "default"

    def limits(self, qualified: Mapping[str, float]) -> list[Limit]:
        return [t.resolve(qualified) for t in self.thresholds]

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "thresholds": [t.as_dict() for t in self.thresholds]}


DEFAULT = WatchPolicy()


def field_error(source: str, where: str, problem: str) -> BadInput:
    """A wrong value of profile `source`, named by its field (`watch.thresholds[1].max`)."""
    return BadInput(f"{source}: {where}: {problem}", file=source, field=where)


def _number(raw: Mapping[str, object], key: str, where: str, source: str, *, positive: bool = True) -> float:
    value = raw[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < 0
        or (positive and value == 0)
    ):
        sign = "a positive number" if positive else "a number >= 0"
        raise field_error(source, f"{where}.{key}", f"{value!r}; expected {sign}")
    return float(value)


def _whole(raw: Mapping[str, object], key: str, source: str, top: int) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise field_error(source, f"watch.{key}", f"{value!r}; expected a whole number from 1 to {top}")
    return value


def _threshold(raw: object, index: int, source: str) -> Threshold:
    where = f"watch.thresholds[{index}]"
    if not isinstance(raw, dict):
        raise field_error(source, where, "expected a table")
    metric = raw.get("metric")
    if metric not in METRICS:
        raise field_error(source, f"{where}.metric", f"{metric!r}; expected one of {sorted(METRICS)}")
    unknown = sorted(set(raw) - {"metric", *BOUNDS})
    bounds = [b for b in BOUNDS if b in raw]
    if unknown or len(bounds) != 1:
        found = f"; unknown {unknown}" if unknown else f"; found {bounds}"
        raise field_error(source, where, f"expected `metric` and exactly one of {list(BOUNDS)}{found}")
    bound = bounds[0]
    if bound.endswith("_ratio") and metric not in QUALIFIED:
        raise field_error(
            source,
            f"{where}.{bound}",
            f"{metric} has no qualified value to be relative to; "
            f"use max or min (relative metrics: {sorted(QUALIFIED)})",
        )
    value = _number(raw, bound, where, source, positive=bound.endswith("_ratio"))
    return Threshold(str(metric), bound, value)


def parse_watch(raw: object, source: str) -> WatchPolicy:
    """The `[watch]` table of profile `source` (None: the default policy)."""
    if raw is None:
        return DEFAULT
    if not isinstance(raw, dict):
        raise field_error(source, "watch", "expected a table")
    unknown = sorted(set(raw) - _WATCH_KEYS)
    if unknown:
        raise field_error(source, f"watch.{unknown[0]}", f"unknown key; expected {sorted(_WATCH_KEYS)}")
    values: dict[str, object] = {"source": source}
    if "duration" in raw:
        text = str(raw["duration"]).strip()
        try:
            values["duration_s"] = 0.0 if text in ("0", "0s") else parse_duration(text)
        except ValueError as exc:
            raise field_error(source, "watch.duration", str(exc)) from None
    if "interval_s" in raw:
        values["interval_s"] = _number(raw, "interval_s", "watch", source)
    for key, top in (("requests", 64), ("max_tokens", 4096), ("consecutive", 100)):
        if key in raw:
            values[key] = _whole(raw, key, source, top)
    if "thresholds" in raw:
        items = raw["thresholds"]
        if not isinstance(items, list) or not items:
            raise field_error(source, "watch.thresholds", "expected at least one [[watch.thresholds]] table")
        values["thresholds"] = tuple(_threshold(t, i, source) for i, t in enumerate(items))
    return WatchPolicy(**{**DEFAULT.__dict__, **values})


def qualified_values(cells: Sequence[Mapping[str, object]]) -> dict[str, float]:
    """The qualified values relative thresholds resolve against: the capacity gate's measured
    cell of the smallest context at concurrency 1 (the nearest to a short routed sample)."""
    measured = [c for c in cells if not c.get("skipped") and c.get("concurrency") == 1]
    if not measured:
        return {}
    cell = min(measured, key=lambda c: c.get("nominal_tokens") or 0)  # type: ignore[arg-type,return-value]
    return {metric: float(v) for metric, key in QUALIFIED.items() if (v := number(cell.get(key))) is not None}


def metrics_of(sample: Mapping[str, object]) -> dict[str, float | None]:
    """A journaled sample's `metrics` (metric -> value, None where it measured none)."""
    found = sample.get("metrics")
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) if isinstance(v, int | float) else None for k, v in found.items()}


def breaches(
    limits: Sequence[Limit], samples: Sequence[Mapping[str, float | None]], consecutive: int
) -> list[JSONObject]:
    """The limits failed by `consecutive` samples in a row (each sample: metric -> value; one
    that cannot judge a limit breaks its run), each with the breaching samples' values. What
    `recheck --slo` judges a standing serve by, and a watched promote its candidate."""
    found: list[JSONObject] = []
    for i, limit in enumerate(limits):
        run: list[float | None] = []
        for metrics in samples:
            observed = metrics.get(limit.metric)
            if limit.holds(observed) is False:
                run.append(observed)
                if len(run) >= consecutive:
                    found.append({"threshold": i, **limit.as_dict(), "observed": list(run[-consecutive:])})
                    break
            else:
                run = []
    return found
