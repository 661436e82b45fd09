"""Evidence on disk: a transaction's JSON artifacts, each written once, then its manifest.

Layout: `<evidence_dir>/<tx_id>/<artifact>.json` plus `manifest.json` listing every
artifact with its SHA-256 and size (`manifest.py`). Artifacts are written once
(evidence is immutable: a second write of the same name is refused).
`evidence_export.export_bundle` writes a shareable, redacted copy;
`evidence_verify.verify_bundle` re-hashes a directory against its manifest and binds
the manifest to what was recorded. Their names are re-exported here, the import path
callers have always used.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from anvil_ctl.atomic import atomic_write
from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.core.validate import utc_stamp
from anvil_ctl.qualify.evidence_export import ExportResult, Redaction, export_bundle
from anvil_ctl.qualify.evidence_verify import (
    Binding,
    ManifestReference,
    Mismatch,
    VerifyResult,
    verify_bundle,
)
from anvil_ctl.qualify.manifest import (
    GPU_UUID_RE,
    MANIFEST,
    MANIFEST_VERSION,
    SAFE_NAME,
    Artifact,
    artifact_of,
    check_manifest,
    manifest_sha256,
    read_manifest,
    to_json,
)

__all__ = [
    "GPU_UUID_RE",
    "MANIFEST",
    "MANIFEST_VERSION",
    "Artifact",
    "Binding",
    "EvidenceWriter",
    "ExportResult",
    "ManifestReference",
    "Mismatch",
    "Redaction",
    "VerifyResult",
    "check_manifest",
    "export_bundle",
    "manifest_sha256",
    "read_manifest",
    "to_json",
    "verify_bundle",
]


class EvidenceWriter:
    """Writes a transaction's artifacts once each, then its manifest."""

    def __init__(self, evidence_dir: Path, tx_id: str, *, resume: bool = False) -> None:
        """`resume`: a step re-run after a crash; the files already written stay, are listed
        again in the next manifest, and are never overwritten."""
        if not SAFE_NAME.match(tx_id):
            raise BadInput(f"transaction id {tx_id!r}: expected letters, digits, '.', '_' or '-'")
        self.tx_dir = evidence_dir / tx_id
        self.tx_dir.mkdir(parents=True, exist_ok=True)
        self.tx_id = tx_id
        self.artifacts: list[Artifact] = []
        if resume:
            for path in sorted(self.tx_dir.iterdir()):
                if path.is_file() and path.name != MANIFEST and SAFE_NAME.match(path.name):
                    self.artifacts.append(artifact_of(self.tx_dir, path.name, path.read_bytes()))

    def free_name(self, stem: str) -> str:
        """`<stem>.json`, or `<stem>-2.json`, ... when a re-run finds the earlier one written."""
        name, n = f"{stem}.json", 1
        while (self.tx_dir / name).exists():
            n += 1
            name = f"{stem}-{n}.json"
        return name

    def write_json(self, name: str, data: object) -> Artifact:
        if not SAFE_NAME.match(name) or name == MANIFEST:
            raise BadInput(f"artifact name {name!r}: expected a plain file name other than {MANIFEST}")
        path = self.tx_dir / name
        if path.exists():
            raise StepFailed(f"evidence {path} already exists; evidence is immutable", path=str(path))
        payload = to_json(data)
        atomic_write(path, payload)
        artifact = artifact_of(self.tx_dir, name, payload)
        self.artifacts.append(artifact)
        return artifact

    def write_manifest(self, **extra: object) -> Artifact:
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
        return artifact_of(self.tx_dir, MANIFEST, payload)
