"""A redacted, shareable copy of a verified transaction directory.

The source must verify first (a tampered source is refused, not laundered). The copy has
GPU UUIDs (consistently renamed), host paths and secrets redacted, and a manifest of its
own that names the source manifest's SHA-256.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from anvil_ctl.atomic import atomic_write
from anvil_ctl.core.errors import BadInput
from anvil_ctl.evidence.bundle import (
    Artifact,
    ManifestReference,
    read_manifest,
    verify_bundle,
    write_manifest,
)

GPU_UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")


@dataclass(frozen=True)
class Redaction:
    """What an export hides: GPU UUIDs (consistently renamed), host paths, secrets."""

    secrets: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


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
        return GPU_UUID_RE.sub(self._gpu, text)

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


def export_bundle(
    tx_dir: Path,
    out_dir: Path,
    *,
    redact: Redaction | None = None,
    references: Sequence[ManifestReference] | None = None,
) -> ExportResult:
    """Copy a verified transaction's artifacts to `out_dir`, redacted, with a new manifest; the
    source must verify (against `references` when given). Evidence and state paths are redacted."""
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
    redactor = _Redactor(replace(redaction, paths=(*redaction.paths, *auto)))
    manifest, listed = read_manifest(tx_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts = []
    for rel in sorted(a.path for a in listed):
        text = (tx_dir / rel).read_bytes().decode("utf-8", errors="replace")
        payload = redactor.apply(text).encode()
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, payload)
        artifacts.append(Artifact.of(rel, payload))
    manifest_artifact = write_manifest(
        out_dir,
        redactor.apply(str(manifest.get("tx_id", ""))),
        artifacts,
        kind="export",
        source_manifest_sha256=source.manifest_sha256,
        redactions=dict(redactor.counts),
    )
    return ExportResult(
        out_dir=str(out_dir),
        manifest=manifest_artifact,
        artifacts=tuple(artifacts),
        redactions=dict(redactor.counts),
        source_manifest_sha256=source.manifest_sha256 or "",
    )
