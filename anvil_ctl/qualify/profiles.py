"""Qualification profiles: TOML files naming an ordered list of gates with thresholds.

`[[gates]]` tables name a `type` (a key of GATE_TYPES), an optional unique `name` and the gate's
keywords; `[watch]` (see watchpolicy), `select` and `[[boundaries]]` (A/B, see qualify.ab) are
optional. Named profiles ship in `anvil_ctl/profiles/`; errors name the file and the field.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from anvil_ctl.config.inputs import load_toml
from anvil_ctl.core.errors import BadInput
from anvil_ctl.qualify.ab import METRICS, Boundary, parse_boundaries
from anvil_ctl.qualify.gates import GATE_TYPES
from anvil_ctl.qualify.gates.base import Gate
from anvil_ctl.qualify.watchpolicy import DEFAULT, WatchPolicy, parse_watch

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
_TOP_KEYS = {"name", "description", "thinking", "gates", "select", "boundaries", "watch"}


@dataclass(frozen=True)
class GateSpec:
    type: str
    name: str
    params: dict[str, object] = field(default_factory=dict)

    def build(self) -> Gate:
        return GATE_TYPES[self.type](name=self.name, **self.params)


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
        return [spec.build() for spec in self.gates]

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


def available_profiles(search_dirs: Sequence[Path] = (PROFILES_DIR,)) -> list[str]:
    return sorted({p.stem for d in search_dirs if d.is_dir() for p in d.glob("*.toml")})


def _conforms(value: object, hint: type[object]) -> bool:
    """`value` is a `hint` as it stands, without conversion (an int is a float, a bool is no int)."""
    try:
        TypeAdapter(hint).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def _describe(hint: object) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _gate_spec(source: str, index: int, raw: object) -> GateSpec:
    where = f"{source}: gates[{index}]"
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: expected a table", file=source, field=f"gates[{index}]")
    gate_type = raw.get("type")
    if gate_type not in GATE_TYPES:
        raise BadInput(
            f"{where}.type: {gate_type!r} is not a gate; expected one of {sorted(GATE_TYPES)}",
            file=source,
            field=f"gates[{index}].type",
        )
    cls = GATE_TYPES[gate_type]
    hints = typing.get_type_hints(cls.__init__)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "name")]
    params = {k: v for k, v in raw.items() if k not in ("type", "name")}
    for key, value in params.items():
        if key not in accepted:
            raise BadInput(
                f"{where}.{key}: not a parameter of gate {gate_type!r}; expected one of {accepted}",
                file=source,
                field=f"gates[{index}].{key}",
            )
        if key in hints and not _conforms(value, hints[key]):
            raise BadInput(
                f"{where}.{key}: {value!r} is not {_describe(hints[key])}",
                file=source,
                field=f"gates[{index}].{key}",
            )
    name = raw.get("name", gate_type)
    if not isinstance(name, str) or not name:
        raise BadInput(f"{where}.name: expected a non-empty string", file=source)
    return GateSpec(type=gate_type, name=name, params=params)


def parse_profile(data: Mapping[str, object], source: str) -> Profile:
    """A profile from parsed TOML; `source` names the file in errors."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise BadInput(
            f"{source}: {', '.join(unknown)}: unknown key; expected {sorted(_TOP_KEYS)}",
            file=source,
        )
    gates_raw = data.get("gates")
    if not isinstance(gates_raw, list) or not gates_raw:
        raise BadInput(f"{source}: gates: expected at least one [[gates]] table", file=source, field="gates")
    thinking = data.get("thinking", False)
    if thinking is not None and not isinstance(thinking, bool):
        raise BadInput(f"{source}: thinking: expected true or false", file=source, field="thinking")
    specs = tuple(_gate_spec(source, i, raw) for i, raw in enumerate(gates_raw))
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise BadInput(
                f"{source}: gates[{i}].name: {spec.name!r} repeats; gate names must be unique",
                file=source,
                field=f"gates[{i}].name",
            )
        seen.add(spec.name)
    select = data.get("select", "decode_p50")
    if select not in METRICS:
        raise BadInput(
            f"{source}: select: {select!r}; expected one of {sorted(METRICS)}", file=source, field="select"
        )
    name = data.get("name") or Path(source).stem
    return Profile(
        name=str(name),
        description=str(data.get("description", "")),
        thinking=thinking,
        gates=specs,
        source=source,
        ab_metric=str(select),
        boundaries=parse_boundaries(data.get("boundaries"), source),
        watch=parse_watch(data.get("watch"), source),
    )


def load_profile(name_or_path: str | Path, *, search_dirs: Sequence[Path] = (PROFILES_DIR,)) -> Profile:
    """A named profile from `search_dirs`, or a TOML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.is_file():
        path = candidate
    else:
        found = [d / f"{name_or_path}.toml" for d in search_dirs if (d / f"{name_or_path}.toml").is_file()]
        if not found:
            raise BadInput(
                f"profile {str(name_or_path)!r} not found; expected one of {available_profiles(search_dirs)}",
                field="profile",
            )
        path = found[0]
    data = load_toml(path, "profile file", BadInput)
    return parse_profile(data, str(path))


def resolve_profile(
    recipe_profile: str | None,
    *,
    profile: str | Path | None = None,
    gates: Sequence[str] | None = None,
    search_dirs: Sequence[Path] = (PROFILES_DIR,),
) -> Profile:
    """The profile a qualification runs: `--profile` over the recipe's, then `--gates`."""
    chosen = profile or recipe_profile or "smoke"
    loaded = load_profile(chosen, search_dirs=search_dirs)
    return loaded.select(gates) if gates else loaded
