"""Verifying an evidence directory against its manifest, and the manifest against references.

A manifest only vouches for the files it lists; whoever edits an artifact can
update its `sha256` and `size` too. What binds a directory to what was recorded
is the manifest's own SHA-256: printed at export, recorded in the state
database for every manifest written (qualify, export). `verify_bundle` checks it
against the references its caller passes (the database, `--expect-manifest`)
and says which it used; with references requested but none knowing this
manifest, the bundle is reported unbound, never "ok".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, get_int, get_str
from anvil_ctl.qualify.manifest import MANIFEST, listed_entries, manifest_sha256, read_manifest


@dataclass(frozen=True)
class Mismatch:
    """One way a directory differs from its manifest."""

    path: str
    problem: str  # missing | sha256 | size | unlisted | unsafe_path | unreadable | manifest
    expected: str | int | None = None
    actual: str | int | None = None


@dataclass(frozen=True)
class ManifestReference:
    """What one source says the manifest's SHA-256 must be.

    `source`: "database" or "--expect-manifest"; `sha256s`: the values it accepts (empty:
    the source knows nothing of this manifest, `note` says why).
    """

    source: str
    sha256s: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Binding:
    """The manifest's SHA-256 held against one reference: matched True/False, None if unknown."""

    against: str
    expected: tuple[str, ...]
    matched: bool | None
    note: str = ""


@dataclass(frozen=True)
class VerifyResult:
    directory: str
    checked: int
    mismatches: tuple[Mismatch, ...]
    manifest_sha256: str | None = None
    bindings: tuple[Binding, ...] | None = None  # None: no binding was asked for

    @property
    def artifacts_ok(self) -> bool:
        """Every listed file is there with the listed hash and size, and nothing else is."""
        return not any(m.problem in _ARTIFACT_PROBLEMS for m in self.mismatches)

    @property
    def bound(self) -> bool | None:
        """The manifest is one a reference recorded (None: no binding was asked for)."""
        if self.bindings is None:
            return None
        return any(b.matched for b in self.bindings) and not any(b.matched is False for b in self.bindings)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def as_dict(self) -> JSONObject:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "checked": self.checked,
            "manifest_sha256": self.manifest_sha256,
            "bound": self.bound,
            "bindings": [asdict(b) for b in self.bindings] if self.bindings is not None else None,
            "mismatches": [asdict(m) for m in self.mismatches],
        }


_ARTIFACT_PROBLEMS = frozenset({"missing", "sha256", "size", "unlisted", "unsafe_path", "manifest"})


def _bind(sha: str, references: Sequence[ManifestReference]) -> tuple[tuple[Binding, ...], list[Mismatch]]:
    bindings = tuple(
        Binding(r.source, r.sha256s, (sha in r.sha256s) if r.sha256s else None, r.note) for r in references
    )
    problems = [
        Mismatch(MANIFEST, "manifest_sha256", f"{b.against}: {', '.join(b.expected)}", sha)
        for b in bindings
        if b.matched is False
    ]
    if not any(b.matched for b in bindings) and not problems:
        tried = "; ".join(f"{b.against}: {b.note or 'no record'}" for b in bindings) or "no reference"
        problems.append(Mismatch(MANIFEST, "unbound", f"a recorded manifest SHA-256 ({tried})", sha))
    return bindings, problems


def verify_bundle(directory: Path, references: Sequence[ManifestReference] | None = None) -> VerifyResult:
    """Re-hash every artifact named by the manifest; list missing, changed and unlisted files.

    With `references`, also hold the manifest's own SHA-256 against each (see the module
    doc): a manifest none of them recorded is `unbound`, one that differs `manifest_sha256`.
    """
    try:
        manifest = read_manifest(directory)
    except BadInput as exc:
        return VerifyResult(
            str(directory),
            0,
            (Mismatch(MANIFEST, "manifest", None, str(exc)),),
            bindings=None if references is None else (),
        )
    root = directory.resolve()
    mismatches: list[Mismatch] = []
    listed: set[str] = set()
    for entry in listed_entries(manifest):
        rel = str(entry.get("path", ""))
        sha256, size = get_str(entry, "sha256"), get_int(entry, "size")
        listed.add(rel)
        try:
            target = (root / rel).resolve()
        except (OSError, RuntimeError):  # a symlink loop
            mismatches.append(Mismatch(rel, "unreadable"))
            continue
        if not rel or Path(rel).is_absolute() or root not in target.parents:
            mismatches.append(Mismatch(rel, "unsafe_path"))
            continue
        if not target.is_file():
            mismatches.append(Mismatch(rel, "missing", sha256))
            continue
        try:
            data = target.read_bytes()
        except OSError as exc:
            mismatches.append(Mismatch(rel, "unreadable", None, exc.strerror))
            continue
        if len(data) != size:
            mismatches.append(Mismatch(rel, "size", size, len(data)))
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            mismatches.append(Mismatch(rel, "sha256", sha256, digest))
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST and rel not in listed:
            mismatches.append(Mismatch(rel, "unlisted"))
    sha = manifest_sha256(directory)
    bindings = None
    if references is not None:
        bindings, problems = _bind(sha, references)
        mismatches.extend(problems)
    return VerifyResult(str(directory), len(listed), tuple(mismatches), sha, bindings)
