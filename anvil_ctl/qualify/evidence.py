"""Evidence on disk: per-transaction JSON artifacts, a SHA-256 manifest, export and verify.

Layout: `<evidence_dir>/<tx_id>/<artifact>.json` plus `manifest.json` listing every
artifact with its SHA-256 and size. Artifacts are written once (evidence is
immutable: a second write of the same name is refused). `export_bundle` writes a
shareable copy with GPU UUIDs, host paths and secrets redacted and its own
manifest; `verify_bundle` re-hashes a directory against its manifest and lists
every mismatch.
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
from anvil_ctl.core.errors import BadInput, StepFailed

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
GPU_UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


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
            "created_at": datetime.now(UTC).isoformat(),
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
    problem: str  # missing | sha256 | size | unlisted | unsafe_path | manifest
    expected: str | int | None = None
    actual: str | int | None = None


@dataclass(frozen=True)
class VerifyResult:
    directory: str
    checked: int
    mismatches: tuple[Mismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def as_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "checked": self.checked,
            "mismatches": [asdict(m) for m in self.mismatches],
        }


def read_manifest(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        raise BadInput(f"{directory}: no {MANIFEST}", path=str(directory)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{directory / MANIFEST}: not JSON: {exc}", path=str(directory)) from None
    if not isinstance(data, dict) or not isinstance(data.get("artifacts"), list):
        raise BadInput(f"{directory / MANIFEST}: expected an object with an 'artifacts' list")
    return data


def verify_bundle(directory: Path) -> VerifyResult:
    """Re-hash every artifact named by the manifest; list missing, changed and unlisted files."""
    try:
        manifest = read_manifest(directory)
    except BadInput as exc:
        return VerifyResult(str(directory), 0, (Mismatch(MANIFEST, "manifest", None, str(exc)),))
    root = directory.resolve()
    mismatches: list[Mismatch] = []
    listed: set[str] = set()
    for entry in manifest["artifacts"]:
        rel = str(entry.get("path", ""))
        listed.add(rel)
        target = (root / rel).resolve()
        if not rel or Path(rel).is_absolute() or root not in target.parents:
            mismatches.append(Mismatch(rel, "unsafe_path"))
            continue
        if not target.is_file():
            mismatches.append(Mismatch(rel, "missing", entry.get("sha256")))
            continue
        data = target.read_bytes()
        if len(data) != entry.get("size"):
            mismatches.append(Mismatch(rel, "size", entry.get("size"), len(data)))
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.get("sha256"):
            mismatches.append(Mismatch(rel, "sha256", entry.get("sha256"), digest))
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST and rel not in listed:
            mismatches.append(Mismatch(rel, "unlisted"))
    return VerifyResult(str(directory), len(listed), tuple(mismatches))


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "manifest": self.manifest.as_dict(),
            "artifacts": [a.as_dict() for a in self.artifacts],
            "redactions": self.redactions,
        }


def export_bundle(
    tx_dir: Path, out_dir: Path, *, redact: Redaction | None = None, extra_paths: Sequence[str] = ()
) -> ExportResult:
    """Copy a verified transaction's artifacts to `out_dir`, redacted, with a new manifest.

    The source must verify first (a tampered source is refused, not laundered). The
    resolved evidence and state directories are always redacted as host paths.
    """
    source = verify_bundle(tx_dir)
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
        "created_at": datetime.now(UTC).isoformat(),
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
    )
