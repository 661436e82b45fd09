"""The claim ledger: every published number bound to its conditions and to the evidence it
comes from, recounted from a verified bundle before it is posted.

A claims file is TOML: `title`, `finding`, and `[[claims]]` tables (`claim`, `published`,
`decimals`, `conditions`, `artifact`, `path`, `[[claims.condition]]` numbers recounted too; or
`origin = "external-prior"` with its `source`, never recounted). Paths: keys joined by `.`,
`[3]` indexes a list, `[key=value,...]` picks the one element with those fields. A local claim
must come from an artifact the bundle's `provenance.json` lists as a local measurement.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr

from anvil_ctl.config.fields import Strict
from anvil_ctl.config.inputs import load_toml, validated
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.evidence.bundle import VerifyResult, verify_bundle

Origin = Literal["local", "external-prior"]
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")


class PathError(Exception):
    """A path that does not lead to a value (internal: becomes a claim's problem)."""


_STEP = re.compile(r"(\.*)(?:([^.\[\]]+)|\[([^\[\]]*)\])?")
"""One step of a path: dots, then a key or a [selector]."""


def resolve(data: JSONValue, path: str) -> JSONValue:
    """The value at `path` in `data` (see the module docstring); PathError says where it stops."""
    node = data
    walked = ""
    at = 0
    while at < len(path):
        step = _STEP.match(path, at)
        assert step is not None  # every part of the pattern is optional
        dots, name, selector = step.groups()
        if step.end() == at or (name is not None and at and not dots):
            raise PathError(f"{path[at:]!r} is not a key with optional [selectors]")
        at = step.end()
        if name is not None:
            if not isinstance(node, dict) or name not in node:
                raise PathError(f"no key {name!r} at {walked or 'the top'}")
            node = node[name]
            walked = f"{walked}.{name}" if walked else name
        elif selector is not None:
            if not isinstance(node, list):
                raise PathError(f"{walked} is not a list")
            if re.fullmatch(r"-?\d+", selector):
                index = int(selector)
                if not -len(node) <= index < len(node):
                    raise PathError(f"{walked}[{index}] is out of range ({len(node)} elements)")
                node = node[index]
            else:
                wanted = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
                found = [
                    item
                    for item in node
                    if isinstance(item, dict) and all(_same(item.get(k), v) for k, v in wanted.items())
                ]
                if len(found) != 1:
                    raise PathError(f"{walked}[{selector}] matches {len(found)} elements, expected one")
                node = found[0]
            walked += f"[{selector}]"
    return node


def _same(value: object, text: str) -> bool:
    if isinstance(value, bool):
        return str(value).lower() == text.lower()
    if isinstance(value, int | float):
        try:
            return Decimal(str(value)) == Decimal(text)
        except InvalidOperation:
            return False
    return str(value) == text


@dataclass(frozen=True)
class Number:
    """A number as published: its text, its value and how many decimals it shows."""

    text: str
    value: Decimal
    decimals: int

    @classmethod
    def parse(cls, raw: object) -> Number:
        text = str(raw).strip() if isinstance(raw, int | float | str) and not isinstance(raw, bool) else ""
        if not _NUMBER.match(text):
            raise ValueError(f"{raw!r} is not a number as published (e.g. 112.07 or 2,969)")
        plain = text.replace(",", "")
        decimals = len(plain.split(".", 1)[1]) if "." in plain else 0
        return cls(text, Decimal(plain), decimals)


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("expected text")
    return value


Published = Annotated[Number, BeforeValidator(Number.parse)]
Text = Annotated[str, AfterValidator(_text)]
Decimals = Annotated[int, Field(strict=True, ge=0, le=12)]


class _Condition(Strict):
    """A `[[claims.condition]]` table (`artifact` None: the claim's; `decimals` None: as many as
    the number shows)."""

    published: Published
    artifact: Text | None = None
    path: Text
    decimals: Decimals | None = None


class Claim(Strict):
    """A `[[claims]]` table: a local claim is recounted (`published` at `path` of `artifact`, and
    its `condition` numbers); an external-prior one names its `source` and is never recounted."""

    claim: Text
    origin: Origin = "local"
    conditions: str = ""
    source: str = ""
    published: Published | None = None
    artifact: Text | None = None
    path: Text | None = None
    decimals: Decimals | None = None
    condition: list[_Condition] = []

    @property
    def recounts(self) -> list[tuple[Number, str, str, int]]:
        """Each number to recount (the claim's own, then its conditions'; none for an external-prior
        claim): as published, the artifact and path it comes from, and its decimals."""
        own = (self.published, self.artifact, self.path or "", self.decimals)
        rows = [own, *((c.published, c.artifact, c.path, c.decimals) for c in self.condition)]
        return [
            (n, a or self.artifact or "", p, n.decimals if d is None else d)
            for n, a, p, d in rows
            if n is not None
        ]


class Ledger(Strict):
    """A claims file: its claims, and the title and finding its table is printed under."""

    title: str = ""
    finding: str = ""
    claims: list[Claim] = Field(min_length=1)
    _path: str = PrivateAttr("")
    """The file it was read from (never a key of the file)."""


def _bad(file: str, where: str, problem: str) -> BadInput:
    return BadInput(f"{file}: {where}: {problem}", file=file, field=where)


def _check(claim: Claim, where: str, file: str) -> None:
    """What one table cannot say: a local claim without its evidence, an external one with some."""
    if claim.origin == "external-prior":
        if not claim.source.strip():
            raise _bad(file, f"{where}.source", "an external-prior claim names where it was published")
        if claim.model_fields_set & {"artifact", "path", "condition"}:
            raise _bad(
                file,
                where,
                "an external-prior claim is not recounted from local evidence; "
                "expected no artifact, path or condition",
            )
        return
    if claim.published is None:
        raise _bad(file, f"{where}.published", "expected the number as published")
    for key in ("artifact", "path"):
        if getattr(claim, key) is None:
            raise _bad(file, f"{where}.{key}", f"expected the evidence {key}")


def load_ledger(path: Path) -> Ledger:
    """Read and check a claims file; BadInput names the file and `claims[i].field`."""
    file = str(path)
    data = load_toml(path, "claims file", BadInput)
    ledger = validated(Ledger, data, file)
    for i, claim in enumerate(ledger.claims):
        _check(claim, f"claims[{i}]", file)
    ledger._path = file
    return ledger


def rounded(value: object, decimals: int) -> Decimal:
    """`value` rounded half-up to `decimals`, as a publisher rounds."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise PathError(f"the value is {type(value).__name__}, not a number")
    try:
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    except InvalidOperation:
        raise PathError(f"{value!r} is not a number") from None


@dataclass
class ClaimResult:
    claim: str
    origin: Origin
    status: Literal["ok", "differs", "missing", "external-prior"]
    problems: list[str] = field(default_factory=list)
    recounted: list[JSONObject] = field(default_factory=list)


@dataclass(frozen=True)
class ClaimsCheck:
    """Every claim recounted from one bundle; `ok` only when every local claim matches."""

    ledger: str
    evidence: str
    bundle: VerifyResult
    claims: tuple[ClaimResult, ...]

    @property
    def ok(self) -> bool:
        return self.bundle.ok and all(r.status in ("ok", "external-prior") for r in self.claims)

    def as_dict(self) -> JSONObject:
        return {**asdict(self), "ok": self.ok, "bundle": self.bundle.as_dict()}


def check_ledger(ledger: Ledger, directory: Path) -> ClaimsCheck:
    """Recount every local claim from the verified bundle at `directory`."""
    if not directory.is_dir():
        raise BadInput(f"--evidence {directory}: not a directory", field="evidence")
    bundle = verify_bundle(directory)
    try:  # what the bundle's provenance lists as local measurements (None: no provenance record)
        listed = json.loads((directory / "provenance.json").read_text()).get("local_measurements") or {}
    except (OSError, ValueError):
        listed = {}
    local = set(artifacts) if isinstance(artifacts := listed.get("artifacts"), list) else None
    cache: dict[str, JSONValue] = {}
    results = []
    for claim in ledger.claims:
        if claim.origin == "external-prior":
            results.append(ClaimResult(claim.claim, claim.origin, "external-prior"))
            continue
        result = ClaimResult(claim.claim, claim.origin, "ok")
        for published, artifact, path, decimals in claim.recounts:
            problem = _problem_with(artifact, path, bundle, local, cache)
            if problem is not None:
                if problem not in result.problems:  # a claim and its conditions share an artifact
                    result.problems.append(problem)
                result.status = "missing"
                continue
            try:
                value = resolve(cache[artifact], path)
                got = rounded(value, decimals)
            except PathError as exc:
                result.problems.append(f"{artifact}: {path}: {exc}")
                result.status = "missing"
                continue
            entry: JSONObject = {
                "published": published.text,
                "recounted": f"{got:,.{decimals}f}",
                "raw": value,
                "artifact": artifact,
                "path": path,
                "decimals": decimals,
            }
            result.recounted.append(entry)
            if got != rounded(published.value, decimals):
                result.problems.append(
                    f"published {published.text}, the evidence says {entry['recounted']} "
                    f"({artifact}: {path} = {value})"
                )
                if result.status == "ok":
                    result.status = "differs"
        results.append(result)
    return ClaimsCheck(ledger._path, str(directory), bundle, tuple(results))


def _problem_with(
    name: str, path: str, bundle: VerifyResult, local: set[str] | None, cache: dict[str, JSONValue]
) -> str | None:
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return f"{name}: expected a file name inside the bundle"
    top = re.split(r"[.\[]", path, maxsplit=1)[0]
    if name == "provenance.json" and top in ("external_prior", "source"):
        return f"{name}: {path} is external-prior, not a local measurement; mark the claim origin"
    if local is not None and name not in local and name != "provenance.json":
        return f"{name}: not a local measurement of this bundle (provenance.json does not list it)"
    if any(m.path == name for m in bundle.mismatches):
        return f"{name}: does not match the bundle's manifest"
    if name not in cache:
        try:
            cache[name] = json.loads((Path(bundle.directory) / name).read_text())
        except FileNotFoundError:
            return f"{name}: artifact missing from the bundle"
        except (OSError, ValueError) as exc:
            return f"{name}: not readable JSON: {exc}"
    return None


def render_ledger(ledger: Ledger) -> str:
    """The ledger as the seeds print it: public claim, conditions, evidence (a Markdown table)."""
    lines = ["| Public claim | Conditions | Evidence |", "|---|---|---|"]
    finding = ledger.finding or "evidence bundle"
    for claim in ledger.claims:
        if claim.origin == "external-prior":
            evidence = f"external-prior, not measured here: {claim.source}"
        else:
            evidence = f"{finding} · " + " · ".join(sorted({a for _, a, _, _ in claim.recounts}))
        cells = (claim.claim, claim.conditions or "-", evidence)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    head = f"Claim ledger: {ledger.title}\n\n" if ledger.title else ""
    return head + "\n".join(lines) + "\n"
