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
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Literal

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.evidence.bundle import VerifyResult, verify_bundle

Origin = Literal["local", "external-prior"]
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")
_CLAIM_KEYS = {
    "claim",
    "published",
    "decimals",
    "conditions",
    "artifact",
    "path",
    "origin",
    "source",
    "condition",
}
_CONDITION_KEYS = {"published", "decimals", "path", "artifact"}
_TOP_KEYS = {"title", "finding", "claims"}


class PathError(Exception):
    """A path that does not lead to a value (internal: becomes a claim's problem)."""


def _path_parts(path: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in path:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def resolve(data: JSONValue, path: str) -> JSONValue:
    """The value at `path` in `data` (see the module docstring); PathError says where it stops."""
    node = data
    walked = ""
    for part in _path_parts(path):
        match = re.fullmatch(r"([^\[\]]*)((?:\[[^\[\]]*\])*)", part)
        if match is None:
            raise PathError(f"{part!r} is not a key with optional [selectors]")
        name, selectors = match.groups()
        if name:
            if not isinstance(node, dict) or name not in node:
                raise PathError(f"no key {name!r} at {walked or 'the top'}")
            node = node[name]
            walked = f"{walked}.{name}" if walked else name
        for selector in re.findall(r"\[([^\[\]]*)\]", selectors):
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


# -- the ledger --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A number as published: its text, its value and how many decimals it shows."""

    text: str
    value: Decimal
    decimals: int

    @classmethod
    def parse(cls, raw: object, where: str, file: str) -> Number:
        text = str(raw).strip() if isinstance(raw, int | float | str) and not isinstance(raw, bool) else ""
        if not _NUMBER.match(text):
            raise _bad(file, where, f"{raw!r} is not a number as published (e.g. 112.07 or 2,969)")
        plain = text.replace(",", "")
        decimals = len(plain.split(".", 1)[1]) if "." in plain else 0
        return cls(text, Decimal(plain), decimals)


@dataclass(frozen=True)
class Recount:
    """One number to recount: as published, where it comes from, and its rounding."""

    published: Number
    artifact: str
    path: str
    decimals: int


@dataclass(frozen=True)
class Claim:
    claim: str
    origin: Origin
    conditions: str = ""
    source: str = ""
    number: Recount | None = None
    condition_numbers: tuple[Recount, ...] = ()

    @property
    def artifacts(self) -> list[str]:
        return sorted({r.artifact for r in (self.number, *self.condition_numbers) if r is not None})


@dataclass(frozen=True)
class Ledger:
    path: str
    title: str
    finding: str
    claims: tuple[Claim, ...]


def _bad(file: str, where: str, problem: str) -> BadInput:
    return BadInput(f"{file}: {where}: {problem}", file=file, field=where)


def _recount(raw: Mapping[str, object], where: str, file: str, default_artifact: str | None) -> Recount:
    published = Number.parse(raw.get("published"), f"{where}.published", file)
    artifact = raw.get("artifact", default_artifact)
    path = raw.get("path")
    for key, value in (("artifact", artifact), ("path", path)):
        if not isinstance(value, str) or not value.strip():
            raise _bad(file, f"{where}.{key}", f"expected the evidence {key}")
    decimals = raw.get("decimals", published.decimals)
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= 12:
        raise _bad(file, f"{where}.decimals", "expected 0..12")
    return Recount(published, str(artifact), str(path), decimals)


def _claim(raw: object, where: str, file: str) -> Claim:
    if not isinstance(raw, dict):
        raise _bad(file, where, "expected a table")
    extra = sorted(set(raw) - _CLAIM_KEYS)
    if extra:
        raise _bad(file, f"{where}.{extra[0]}", f"unknown key; expected some of {sorted(_CLAIM_KEYS)}")
    text = raw.get("claim")
    if not isinstance(text, str) or not text.strip():
        raise _bad(file, f"{where}.claim", "expected the public text")
    origin = raw.get("origin", "local")
    if origin not in ("local", "external-prior"):
        raise _bad(file, f"{where}.origin", f"{origin!r}; expected local or external-prior")
    conditions = str(raw.get("conditions", ""))
    if origin == "external-prior":
        if not str(raw.get("source", "")).strip():
            raise _bad(file, f"{where}.source", "an external-prior claim names where it was published")
        if "artifact" in raw or "path" in raw or "condition" in raw:
            raise _bad(
                file,
                where,
                "an external-prior claim is not recounted from local evidence; "
                "expected no artifact, path or condition",
            )
        return Claim(text, "external-prior", conditions, str(raw["source"]))
    number = _recount(raw, where, file, None)
    conditions_raw = raw.get("condition", [])
    if not isinstance(conditions_raw, list):
        raise BadInput(f"{file}: {where}.condition: expected [[claims.condition]] tables", file=file)
    checks = []
    for j, cond in enumerate(conditions_raw):
        cwhere = f"{where}.condition[{j}]"
        if not isinstance(cond, dict) or set(cond) - _CONDITION_KEYS:
            raise _bad(file, cwhere, f"expected a table of {sorted(_CONDITION_KEYS)}")
        checks.append(_recount(cond, cwhere, file, number.artifact))
    return Claim(text, "local", conditions, "", number, tuple(checks))


def load_ledger(path: Path) -> Ledger:
    """Read and check a claims file; BadInput names the file and `claims[i].field`."""
    file = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{file}: claims file not found", file=file) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{file}: not a readable TOML file: {exc}", file=file) from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise BadInput(f"{file}: {unknown[0]}: unknown key; expected {sorted(_TOP_KEYS)}", file=file)
    raw_claims = data.get("claims")
    if not isinstance(raw_claims, list) or not raw_claims:
        raise _bad(file, "claims", "expected at least one [[claims]] table")
    claims = tuple(_claim(raw, f"claims[{i}]", file) for i, raw in enumerate(raw_claims))
    return Ledger(file, str(data.get("title", "")), str(data.get("finding", "")), claims)


# -- the check ---------------------------------------------------------------------------------


def rounded(value: object, decimals: int) -> Decimal:
    """`value` rounded half-up to `decimals`, as a publisher rounds."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
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

    def as_dict(self) -> JSONObject:
        return asdict(self)


@dataclass(frozen=True)
class ClaimsCheck:
    """Every claim recounted from one bundle; `ok` only when every local claim matches."""

    ledger: str
    evidence: str
    bundle: VerifyResult
    results: tuple[ClaimResult, ...]

    @property
    def ok(self) -> bool:
        return self.bundle.ok and all(r.status in ("ok", "external-prior") for r in self.results)

    def as_dict(self) -> JSONObject:
        return {
            "ledger": self.ledger,
            "evidence": self.evidence,
            "ok": self.ok,
            "bundle": self.bundle.as_dict(),
            "claims": [r.as_dict() for r in self.results],
        }


def _local_artifacts(directory: Path) -> set[str] | None:
    """What the bundle's provenance lists as local measurements (None: no provenance record)."""
    try:
        data = json.loads((directory / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    listed = (data.get("local_measurements") or {}).get("artifacts")
    return set(listed) if isinstance(listed, list) else None


def check_ledger(ledger: Ledger, directory: Path) -> ClaimsCheck:
    """Recount every local claim from the verified bundle at `directory`."""
    if not directory.is_dir():
        raise BadInput(f"--evidence {directory}: not a directory", field="evidence")
    bundle = verify_bundle(directory)
    broken = {m.path for m in bundle.mismatches}
    local = _local_artifacts(directory)
    cache: dict[str, JSONValue] = {}
    results = []
    for claim in ledger.claims:
        if claim.origin == "external-prior":
            results.append(ClaimResult(claim.claim, claim.origin, "external-prior"))
            continue
        result = ClaimResult(claim.claim, claim.origin, "ok")
        for recount in (claim.number, *claim.condition_numbers):
            assert recount is not None
            problem = _problem_with(recount, directory, broken, local, cache)
            if problem is not None:
                if problem not in result.problems:  # a claim and its conditions share an artifact
                    result.problems.append(problem)
                result.status = "missing"
                continue
            try:
                value = resolve(cache[recount.artifact], recount.path)
                got = rounded(value, recount.decimals)
            except PathError as exc:
                result.problems.append(f"{recount.artifact}: {recount.path}: {exc}")
                result.status = "missing"
                continue
            want = recount.published.value.quantize(
                Decimal(1).scaleb(-recount.decimals), rounding=ROUND_HALF_UP
            )
            entry: JSONObject = {
                "published": recount.published.text,
                "recounted": f"{got:,.{recount.decimals}f}",
                "raw": value,
                "artifact": recount.artifact,
                "path": recount.path,
                "decimals": recount.decimals,
            }
            result.recounted.append(entry)
            if got != want:
                result.problems.append(
                    f"published {recount.published.text}, the evidence says {entry['recounted']} "
                    f"({recount.artifact}: {recount.path} = {value})"
                )
                if result.status == "ok":
                    result.status = "differs"
        results.append(result)
    return ClaimsCheck(ledger.path, str(directory), bundle, tuple(results))


def _problem_with(
    recount: Recount, directory: Path, broken: set[str], local: set[str] | None, cache: dict[str, JSONValue]
) -> str | None:
    name = recount.artifact
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return f"{name}: expected a file name inside the bundle"
    if name == "provenance.json" and recount.path.split(".", 1)[0].split("[", 1)[0] in (
        "external_prior",
        "source",
    ):
        return f"{name}: {recount.path} is external-prior, not a local measurement; mark the claim origin"
    if local is not None and name not in local and name != "provenance.json":
        return f"{name}: not a local measurement of this bundle (provenance.json does not list it)"
    if name in broken:
        return f"{name}: does not match the bundle's manifest"
    if name not in cache:
        try:
            cache[name] = json.loads((directory / name).read_text())
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
            evidence = f"{finding} · " + " · ".join(claim.artifacts)
        cells = (claim.claim, claim.conditions or "-", evidence)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    head = f"Claim ledger: {ledger.title}\n\n" if ledger.title else ""
    return head + "\n".join(lines) + "\n"
