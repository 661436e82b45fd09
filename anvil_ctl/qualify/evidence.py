"""Evidence on disk: per-transaction JSON artifacts, a SHA-256 manifest, export and verify.

Layout: `<evidence_dir>/<tx_id>/<artifact>.json` plus `manifest.json` listing every
artifact with its SHA-256 and size. Artifacts are written once (evidence is
immutable: a second write of the same name is refused). `export_bundle` writes a
shareable copy with GPU UUIDs, host paths and secrets redacted and its own
manifest; `verify_bundle` re-hashes a directory against its manifest and lists
every mismatch.

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
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from anvil_ctl.atomic import atomic_write
from anvil_ctl.config import read_input_file
from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.core.validate import unsafe_char, utc_stamp

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
GPU_UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 16 << 20
MAX_ARTIFACT_BYTES = 1 << 40


def to_json(data: Any) -> bytes:
    """The artifact encoding: sorted keys, two-space indent, UTF-8, trailing newline."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, default=str) + "\n").encode()


@dataclass(frozen=True)
class Artifact:
    """One file of evidence: its path relative to the transaction directory, hash and size."""

    path: str
    sha256: str
    size: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _artifact(root: Path, rel: str, data: bytes) -> Artifact:
    return Artifact(path=rel, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


class EvidenceWriter:
    """Writes a transaction's artifacts once each, then its manifest."""

    def __init__(self, evidence_dir: Path, tx_id: str, *, resume: bool = False) -> None:
        """`resume`: a step re-run after a crash; the files already written stay, are listed
        again in the next manifest, and are never overwritten."""
        if not _SAFE_NAME.match(tx_id):
            raise BadInput(f"transaction id {tx_id!r}: expected letters, digits, '.', '_' or '-'")
        self.tx_dir = evidence_dir / tx_id
        self.tx_dir.mkdir(parents=True, exist_ok=True)
        self.tx_id = tx_id
        self.artifacts: list[Artifact] = []
        if resume:
            for path in sorted(self.tx_dir.iterdir()):
                if path.is_file() and path.name != MANIFEST and _SAFE_NAME.match(path.name):
                    self.artifacts.append(_artifact(self.tx_dir, path.name, path.read_bytes()))

    def free_name(self, stem: str) -> str:
        """`<stem>.json`, or `<stem>-2.json`, ... when a re-run finds the earlier one written."""
        name, n = f"{stem}.json", 1
        while (self.tx_dir / name).exists():
            n += 1
            name = f"{stem}-{n}.json"
        return name

    def write_json(self, name: str, data: Any) -> Artifact:
        if not _SAFE_NAME.match(name) or name == MANIFEST:
            raise BadInput(f"artifact name {name!r}: expected a plain file name other than {MANIFEST}")
        path = self.tx_dir / name
        if path.exists():
            raise StepFailed(f"evidence {path} already exists; evidence is immutable", path=str(path))
        payload = to_json(data)
        atomic_write(path, payload)
        artifact = _artifact(self.tx_dir, name, payload)
        self.artifacts.append(artifact)
        return artifact

    def write_manifest(self, **extra: Any) -> Artifact:
        """Write manifest.json over every artifact written; returns the manifest's own hash."""
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "tx_id": self.tx_id,
            "created_at": utc_stamp(datetime.now(UTC)),
            "artifacts": [a.as_dict() for a in sorted(self.artifacts, key=lambda a: a.path)],
            **extra,
        }
        payload = to_json(manifest)
        atomic_write(self.tx_dir / MANIFEST, payload)
        return _artifact(self.tx_dir, MANIFEST, payload)


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

    def as_dict(self) -> dict[str, Any]:
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


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an evidence directory, checked entry by entry (see `check_manifest`)."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: not a directory; expected an evidence directory", path=str(directory))
    path = directory / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"{directory}: no {MANIFEST}", path=str(directory))
    text = read_input_file(path, "evidence manifest file", max_bytes=MAX_MANIFEST_BYTES, error=BadInput)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON: {exc}", path=str(directory)) from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deeply; expected a manifest", path=str(directory)) from None
    return check_manifest(data, path)


def check_manifest(data: Any, path: Path) -> dict[str, Any]:
    """`data` if it is a manifest: an object whose `artifacts` list holds one object per file,
    each a distinct relative `path`, a 64-hex `sha256` and a `size` >= 0; BadInput otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("artifacts"), list):
        raise BadInput(f"{path}: expected an object with an 'artifacts' list", path=str(path))
    seen: set[str] = set()
    for i, entry in enumerate(data["artifacts"]):
        where = f"{path}: artifacts[{i}]"
        if not isinstance(entry, dict):
            raise BadInput(f"{where}: expected an object with path, sha256 and size", path=str(path))
        rel, digest, size = entry.get("path"), entry.get("sha256"), entry.get("size")
        if not isinstance(rel, str) or not rel or len(rel) > 4096 or unsafe_char(rel) is not None:
            raise BadInput(f"{where}.path: expected a relative file path", path=str(path))
        if rel in seen:
            raise BadInput(f"{where}.path: {rel!r} is listed twice", path=str(path))
        seen.add(rel)
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise BadInput(f"{where}.sha256: expected 64 lowercase hex digits", path=str(path))
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ARTIFACT_BYTES:
            raise BadInput(f"{where}.size: expected a number of bytes >= 0", path=str(path))
    return data


def manifest_sha256(directory: Path) -> str:
    """The SHA-256 of the directory's manifest file, as bytes on disk."""
    return hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()


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
    for entry in manifest["artifacts"]:
        rel = str(entry.get("path", ""))
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
            mismatches.append(Mismatch(rel, "missing", entry.get("sha256")))
            continue
        try:
            data = target.read_bytes()
        except OSError as exc:
            mismatches.append(Mismatch(rel, "unreadable", None, exc.strerror))
            continue
        if len(data) != entry.get("size"):
            mismatches.append(Mismatch(rel, "size", entry.get("size"), len(data)))
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.get("sha256"):
            mismatches.append(Mismatch(rel, "sha256", entry.get("sha256"), digest))
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


@dataclass(frozen=True)
class Redaction:
    """What an export hides: GPU UUIDs (consistently renamed), host paths, secrets."""

    secrets: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    gpu_uuids: bool = True


@dataclass
class _Redactor:
    redaction: Redaction
    gpu_names: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"gpu_uuids": 0, "paths": 0, "secrets": 0})

    def apply(self, text: str) -> str:
        for secret in sorted({s for s in self.redaction.secrets if s}, key=len, reverse=True):
            # Secrets may appear raw or JSON-escaped inside an artifact.
            for form in {secret, json.dumps(secret)[1:-1]}:
                self.counts["secrets"] += text.count(form)
                text = text.replace(form, "<redacted-secret>")
        for path in sorted(
            {p.rstrip("/") for p in self.redaction.paths if p.strip("/")}, key=len, reverse=True
        ):
            self.counts["paths"] += text.count(path)
            text = text.replace(path, "<host-path>")
        if self.redaction.gpu_uuids:
            text = GPU_UUID_RE.sub(self._gpu, text)
        return text

    def _gpu(self, match: re.Match[str]) -> str:
        uuid = match.group(0).lower()
        self.counts["gpu_uuids"] += 1
        if uuid not in self.gpu_names:
            self.gpu_names[uuid] = f"GPU-REDACTED-{len(self.gpu_names) + 1}"
        return self.gpu_names[uuid]


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    manifest: Artifact
    artifacts: tuple[Artifact, ...]
    redactions: dict[str, int]
    source_manifest_sha256: str = ""
    recorded: bool = False  # the export's manifest SHA-256 is in the state database

    def as_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "manifest": self.manifest.as_dict(),
            "source_manifest_sha256": self.source_manifest_sha256,
            "recorded": self.recorded,
            "artifacts": [a.as_dict() for a in self.artifacts],
            "redactions": self.redactions,
        }


def export_bundle(
    tx_dir: Path,
    out_dir: Path,
    *,
    redact: Redaction | None = None,
    extra_paths: Sequence[str] = (),
    references: Sequence[ManifestReference] | None = None,
) -> ExportResult:
    """Copy a verified transaction's artifacts to `out_dir`, redacted, with a new manifest.

    The source must verify first, against `references` when given (a tampered source is
    refused, not laundered). The resolved evidence and state directories are always
    redacted as host paths.
    """
    source = verify_bundle(tx_dir, references)
    if not source.ok:
        raise BadInput(
            f"{tx_dir}: evidence does not match its manifest; refusing to export",
            mismatches=[asdict(m) for m in source.mismatches],
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BadInput(f"{out_dir}: export directory exists and is not empty", path=str(out_dir))
    redaction = redact or Redaction()
    resolved = tx_dir.resolve()
    auto = [str(p) for p in (resolved, resolved.parent, resolved.parent.parent) if str(p) != "/"]
    redaction = Redaction(
        secrets=redaction.secrets,
        paths=(*redaction.paths, *extra_paths, *auto),
        gpu_uuids=redaction.gpu_uuids,
    )
    redactor = _Redactor(redaction)
    manifest = read_manifest(tx_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts = []
    for entry in sorted(manifest["artifacts"], key=lambda e: str(e["path"])):
        rel = str(entry["path"])
        text = (tx_dir / rel).read_bytes().decode("utf-8", errors="replace")
        payload = redactor.apply(text).encode()
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, payload)
        artifacts.append(_artifact(out_dir, rel, payload))
    source_manifest = (tx_dir / MANIFEST).read_bytes()
    bundle_manifest = {
        "manifest_version": MANIFEST_VERSION,
        "kind": "export",
        "tx_id": redactor.apply(str(manifest.get("tx_id", ""))),
        "created_at": utc_stamp(datetime.now(UTC)),
        "source_manifest_sha256": hashlib.sha256(source_manifest).hexdigest(),
        "redactions": dict(redactor.counts),
        "artifacts": [a.as_dict() for a in artifacts],
    }
    payload = to_json(bundle_manifest)
    atomic_write(out_dir / MANIFEST, payload)
    return ExportResult(
        out_dir=str(out_dir),
        manifest=_artifact(out_dir, MANIFEST, payload),
        artifacts=tuple(artifacts),
        redactions=dict(redactor.counts),
        source_manifest_sha256=source.manifest_sha256 or "",
    )
