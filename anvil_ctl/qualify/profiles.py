"""Qualification profiles: TOML files of `[[gates]]` (a `type` of GATE_TYPES, an optional unique
`name`, the gate's keywords), with optional `[watch]` (watchpolicy), `select` and `[[boundaries]]`
(the A/B's). Named profiles ship in `anvil_ctl/profiles/`; errors name the file and the field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator, validate_call
from pydantic.dataclasses import dataclass as pydantic_dataclass

from anvil_ctl.config.inputs import field_path, load_toml, validated
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.evidence.summary import context_label
from anvil_ctl.qualify.watchpolicy import DEFAULT, WatchPolicy, field_error, parse_watch

# The gates (and their client) import where a profile's gates are checked or built, not here:
# a promote reads only `[watch]`.
if TYPE_CHECKING:
    from anvil_ctl.qualify.gates.base import Gate

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

METRICS: dict[str, tuple[str, bool]] = {
    "decode_p50": ("decode_tps_p50", True),
    "prefill_p50": ("prefill_tps_p50", True),
    "ttft_p50": ("ttft_s_p50", False),
}
"""metric -> (the capacity cell's key, whether higher is better)."""
Metric = Literal["decode_p50", "prefill_p50", "ttft_p50"]
Percent = Annotated[float, Field(strict=True)]
Tokens = Annotated[int, Field(strict=True, ge=0)]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Boundary:
    """A protected boundary: the selected arm's delta on `metric` vs the other arm, per cell."""

    metric: Metric
    min_delta_pct: Percent | None = None
    max_delta_pct: Percent | None = None
    min_context: Tokens = 0
    max_context: Tokens | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _bounded(self) -> Boundary:
        if self.min_delta_pct is None and self.max_delta_pct is None:
            raise ValueError("expected min_delta_pct or max_delta_pct")
        return self

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


@dataclass(frozen=True)
class GateSpec:
    type: str
    name: str
    params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    thinking: bool | None
    gates: tuple[GateSpec, ...]
    source: str = ""
    ab_metric: str = "decode_p50"
    """TOML `select`: the metric that picks the faster arm of an A/B."""
    boundaries: tuple[Boundary, ...] = ()
    watch: WatchPolicy = DEFAULT
    """TOML `[watch]`: the thresholds the serve is held to on the route (`watchpolicy`)."""

    def build(self) -> list[Gate]:
        from anvil_ctl.qualify.gates import GATE_TYPES

        return [GATE_TYPES[g.type](name=g.name, **g.params) for g in self.gates]

    def select(self, names: Sequence[str]) -> Profile:
        """Only the named gates (by name or type), in profile order: the `--gates` override."""
        known = {g.name for g in self.gates} | {g.type for g in self.gates}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise BadInput(
                f"--gates: {', '.join(unknown)} not in profile {self.name!r}; "
                f"expected some of {sorted(g.name for g in self.gates)}",
                field="gates",
            )
        chosen = tuple(g for g in self.gates if g.name in names or g.type in names)
        return replace(self, gates=chosen)

    def as_dict(self) -> dict[str, object]:
        """The profile as its TOML says it (gate parameters are TOML values)."""
        return {
            "name": self.name,
            "description": self.description,
            "thinking": self.thinking,
            "source": self.source,
            "gates": [{"type": g.type, "name": g.name, **g.params} for g in self.gates],
            "select": self.ab_metric,
            "boundaries": [b.as_dict() for b in self.boundaries],
        }


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


class _ProfileFile(BaseModel):
    """A profile file's tables as TOML gives them; each gate is checked against its own class."""

    model_config = ConfigDict(extra="forbid")
    name: str = ""
    description: str = ""
    thinking: StrictBool | None = False
    gates: list[dict[str, object]] = Field(min_length=1)
    select: Metric = "decode_p50"
    boundaries: list[Boundary] = []
    watch: object = None


@functools.cache
def _arguments(gate_type: str) -> Callable[..., None]:
    """The gate's `__init__`, checking its arguments strictly against its fields' types (a "3"
    is no int, a 1 no bool)."""
    from anvil_ctl.qualify.gates import GATE_TYPES

    return validate_call(config=ConfigDict(strict=True))(GATE_TYPES[gate_type].__init__)


def _gate_spec(source: str, index: int, raw: dict[str, object]) -> GateSpec:
    from anvil_ctl.qualify.gates import GATE_TYPES

    where = f"gates[{index}]"
    gate_type = raw.get("type")
    if gate_type not in GATE_TYPES:
        raise field_error(
            source, f"{where}.type", f"{gate_type!r} is not a gate; expected one of {sorted(GATE_TYPES)}"
        )
    cls = GATE_TYPES[gate_type]
    name = raw.get("name", gate_type)
    if not isinstance(name, str) or not name:
        raise BadInput(f"{source}: {where}.name: expected a non-empty string", file=source)
    params = {k: v for k, v in raw.items() if k not in ("type", "name")}
    try:
        _arguments(gate_type)(object.__new__(cls), name=name, **params)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = field_path(where, first["loc"])
        problem = first["msg"].replace("Input should be", "expected", 1)
        if first["type"] == "unexpected_keyword_argument":
            accepted = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
            problem = f"not a parameter of gate {gate_type!r}; expected one of {accepted}"
        raise field_error(source, key, problem) from None
    return GateSpec(type=gate_type, name=name, params=params)


def parse_profile(data: Mapping[str, object], source: str) -> Profile:
    """A profile from parsed TOML; `source` names the file in errors."""
    top = validated(_ProfileFile, data, source)
    specs = tuple(_gate_spec(source, i, raw) for i, raw in enumerate(top.gates))
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise field_error(source, f"gates[{i}].name", f"{spec.name!r} repeats; gate names must be unique")
        seen.add(spec.name)
    return Profile(
        name=top.name or Path(source).stem,
        description=top.description,
        thinking=top.thinking,
        gates=specs,
        source=source,
        ab_metric=top.select,
        boundaries=tuple(top.boundaries),
        watch=parse_watch(top.watch, source),
    )


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml" and not path.is_file():
        path = PROFILES_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            raise BadInput(
                f"profile {str(name_or_path)!r} not found; expected one of {available_profiles()}",
                field="profile",
            )
    data = load_toml(path, "profile file", BadInput)
    return parse_profile(data, str(path))


def resolve_profile(
    recipe_profile: str | None,
    *,
    profile: str | Path | None = None,
    gates: Sequence[str] | None = None,
) -> Profile:
    """The profile a qualification runs: `--profile` over the recipe's, then `--gates`."""
    chosen = profile or recipe_profile or "smoke"
    loaded = load_profile(chosen)
    return loaded.select(gates) if gates else loaded
