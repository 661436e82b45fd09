"""Evidence on disk: a transaction's JSON artifacts, each written once, and the manifest listing
them; verifying a directory against its manifest; a redacted, shareable export of a verified
directory; a verified bundle as read.

A manifest only vouches for the files it lists; what binds a directory to the record is the
manifest's own SHA-256, recorded in the state database (`verify_bundle`'s `references`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from anvil_ctl.atomic import atomic_write
from anvil_ctl.config.inputs import read_input_file
from anvil_ctl.core.errors import BadInput, EvidenceMismatch, StepFailed
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, fields
from anvil_ctl.core.validate import unsafe_char, utc_stamp

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 16 << 20
MAX_ARTIFACT_BYTES = 1 << 40


def to_json(data: object) -> bytes:
    """The artifact encoding: sorted keys, two-space indent, UTF-8, trailing newline."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, default=str) + "\n").encode()


@dataclass(frozen=True)
class Artifact:
    """One file of evidence: its path relative to the transaction directory, hash and size."""

    path: str
    sha256: str
    size: int

    @classmethod
    def of(cls, path: str, data: bytes) -> Artifact:
        return cls(path, hashlib.sha256(data).hexdigest(), len(data))


class EvidenceWriter:
    """Writes a transaction's artifacts once each, then its manifest."""

    def __init__(self, evidence_dir: Path, tx_id: str, *, resume: bool = False) -> None:
        """`resume`: a step re-run after a crash keeps and re-lists the files already written."""
        if not SAFE_NAME.match(tx_id):
            raise BadInput(f"transaction id {tx_id!r}: expected letters, digits, '.', '_' or '-'")
        self.tx_dir = evidence_dir / tx_id
        self.tx_dir.mkdir(parents=True, exist_ok=True)
        self.tx_id = tx_id
        self.artifacts: list[Artifact] = []
        if resume:
            for path in sorted(self.tx_dir.iterdir()):
                if path.is_file() and path.name != MANIFEST and SAFE_NAME.match(path.name):
                    self.artifacts.append(Artifact.of(path.name, path.read_bytes()))

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
        artifact = Artifact.of(name, payload)
        self.artifacts.append(artifact)
        return artifact

    def write_manifest(self, **extra: object) -> Artifact:
        """Write manifest.json over every artifact written; returns the manifest's own hash."""
        return write_manifest(self.tx_dir, self.tx_id, self.artifacts, **extra)


def write_manifest(directory: Path, tx_id: str, artifacts: Sequence[Artifact], **extra: object) -> Artifact:
    """Write `directory`/manifest.json listing `artifacts` (by path); returns its own hash."""
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "tx_id": tx_id,
        "created_at": utc_stamp(datetime.now(UTC)),
        "artifacts": [asdict(a) for a in sorted(artifacts, key=lambda a: a.path)],
        **extra,
    }
    payload = to_json(manifest)
    atomic_write(directory / MANIFEST, payload)
    return Artifact.of(MANIFEST, payload)


def read_manifest(directory: Path) -> tuple[JSONObject, list[Artifact]]:
    """The manifest of an evidence directory and its entries, each checked: an object whose
    `artifacts` list holds one object per file, each a distinct relative `path`, a 64-hex `sha256`
    and a `size` >= 0; BadInput otherwise."""
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
    if not isinstance(data, dict) or not isinstance(data.get("artifacts"), list):
        raise BadInput(f"{path}: expected an object with an 'artifacts' list", path=str(path))
    artifacts: list[Artifact] = []
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
        artifacts.append(Artifact(rel, digest, size))
    return data, artifacts


@dataclass(frozen=True)
class Mismatch:
    """One way a directory differs from its manifest."""

    path: str
    problem: str  # missing | sha256 | size | unlisted | unsafe_path | unreadable | manifest
    expected: str | int | None = None
    actual: str | int | None = None


@dataclass(frozen=True)
class ManifestReference:
    """What one source ("database" or "--expect-manifest") says the manifest's SHA-256 must be (no
    `expected`: the source knows nothing of this manifest, `note` says why); once the manifest is
    held against it, `matched` True/False, None if unknown."""

    against: str
    expected: tuple[str, ...]
    note: str = ""
    matched: bool | None = None


@dataclass(frozen=True)
class VerifyResult:
    directory: str
    checked: int
    mismatches: tuple[Mismatch, ...]
    manifest_sha256: str | None = None
    bindings: tuple[ManifestReference, ...] | None = None  # None: no binding was asked for

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
        return {**asdict(self), "ok": self.ok, "bound": self.bound}


def verify_bundle(directory: Path, references: Sequence[ManifestReference] | None = None) -> VerifyResult:
    """Re-hash every artifact the manifest names; list missing, changed and unlisted files. With
    `references`, a manifest none of them recorded is `unbound`, one that differs `manifest_sha256`."""
    try:
        _, artifacts = read_manifest(directory)
    except BadInput as exc:
        return VerifyResult(
            str(directory),
            0,
            (Mismatch(MANIFEST, "manifest", None, str(exc)),),
            bindings=None if references is None else (),
        )
    root = directory.resolve()
    mismatches: list[Mismatch] = []
    listed = {a.path for a in artifacts}  # read_manifest refuses a path listed twice
    for a in artifacts:
        rel = a.path
        try:
            target = (root / rel).resolve()
        except (OSError, RuntimeError):  # a symlink loop
            mismatches.append(Mismatch(rel, "unreadable"))
            continue
        if Path(rel).is_absolute() or root not in target.parents:
            mismatches.append(Mismatch(rel, "unsafe_path"))
            continue
        if not target.is_file():
            mismatches.append(Mismatch(rel, "missing", a.sha256))
            continue
        try:
            data = target.read_bytes()
        except OSError as exc:
            mismatches.append(Mismatch(rel, "unreadable", None, exc.strerror))
            continue
        if len(data) != a.size:
            mismatches.append(Mismatch(rel, "size", a.size, len(data)))
        digest = hashlib.sha256(data).hexdigest()
        if digest != a.sha256:
            mismatches.append(Mismatch(rel, "sha256", a.sha256, digest))
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST and rel not in listed:
            mismatches.append(Mismatch(rel, "unlisted"))
    sha = hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()
    bindings = None
    if references is not None:
        bindings = tuple(replace(r, matched=sha in r.expected if r.expected else None) for r in references)
        mismatches.extend(
            Mismatch(MANIFEST, "manifest_sha256", f"{b.against}: {', '.join(b.expected)}", sha)
            for b in bindings
            if b.matched is False
        )
        if all(b.matched is None for b in bindings):
            tried = "; ".join(f"{b.against}: {b.note or 'no record'}" for b in bindings) or "no reference"
            mismatches.append(Mismatch(MANIFEST, "unbound", f"a recorded manifest SHA-256 ({tried})", sha))
    return VerifyResult(str(directory), len(listed), tuple(mismatches), sha, bindings)


GPU_UUID_RE = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")


@dataclass(frozen=True)
class Redaction:
    """What an export hides: GPU UUIDs (consistently renamed), host paths, secrets."""

    secrets: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


class _Redactor:
    """Hides secrets (raw or JSON-escaped inside an artifact) and host paths, longest first, then
    GPU UUIDs, each UUID by one name throughout the export; counts what it hid."""

    def __init__(self, secrets: Iterable[str], paths: Iterable[str]) -> None:
        longest = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.masks = [(f, "<redacted-secret>", "secrets") for s in longest for f in {s, json.dumps(s)[1:-1]}]
        folders = sorted({p.rstrip("/") for p in paths if p.strip("/")}, key=len, reverse=True)
        self.masks += [(p, "<host-path>", "paths") for p in folders]
        self.gpu_names: dict[str, str] = {}
        self.counts = {"gpu_uuids": 0, "paths": 0, "secrets": 0}

    def apply(self, text: str) -> str:
        for needle, mask, kind in self.masks:
            self.counts[kind] += text.count(needle)
            text = text.replace(needle, mask)
        return GPU_UUID_RE.sub(self._gpu, text)

    def _gpu(self, match: re.Match[str]) -> str:
        self.counts["gpu_uuids"] += 1
        return self.gpu_names.setdefault(match.group(0).lower(), f"GPU-REDACTED-{len(self.gpu_names) + 1}")


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
    redact: Redaction = Redaction(),
    references: Sequence[ManifestReference] | None = None,
) -> ExportResult:
    """Copy a verified transaction's artifacts to `out_dir`, redacted, with a manifest of its own
    that names the source manifest's SHA-256. The source must verify (against `references` when
    given): a tampered source is refused, not laundered. Evidence and state paths are redacted."""
    source = verify_bundle(tx_dir, references)
    if not source.ok:
        raise BadInput(
            f"{tx_dir}: evidence does not match its manifest; refusing to export",
            mismatches=[asdict(m) for m in source.mismatches],
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BadInput(f"{out_dir}: export directory exists and is not empty", path=str(out_dir))
    resolved = tx_dir.resolve()
    auto = [str(p) for p in (resolved, resolved.parent, resolved.parent.parent) if str(p) != "/"]
    redactor = _Redactor(redact.secrets, (*redact.paths, *auto))
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


@dataclass(frozen=True)
class Bundle:
    """One verified evidence directory and its JSON artifacts; nothing is read from a bundle
    that differs from its manifest (EvidenceMismatch, exit 6)."""

    tx_id: str
    manifest_sha256: str
    files: dict[str, JSONValue]

    @classmethod
    def load(cls, directory: Path, tx_id: str = "") -> Bundle:
        checked = verify_bundle(directory)
        if not checked.ok:
            problems = ", ".join(f"{m.path}: {m.problem}" for m in checked.mismatches)
            raise EvidenceMismatch(
                f"{directory}: evidence does not match its manifest ({problems}); "
                "nothing is reported from it",
                mismatches=[m.path for m in checked.mismatches],
            )
        manifest, artifacts = read_manifest(directory)
        files: dict[str, JSONValue] = {
            a.path: json.loads((directory / a.path).read_text())
            for a in artifacts
            if a.path.endswith(".json")
        }
        tx = tx_id or str(manifest.get("tx_id", directory.name))
        return cls(tx, checked.manifest_sha256 or "", files)

    def gate(self, gate_type: str) -> JSONObject | None:
        """The first gate artifact (by name) whose evidence says it is of `gate_type`."""
        for _, v in sorted(self.files.items()):
            if isinstance(v, dict) and fields(v.get("evidence", {})).get("gate_type") == gate_type:
                return v
        return None


@dataclass
class ReportInputs:
    qualification: Bundle
    decisions: list[Mapping[str, object]] = field(default_factory=list)
    waivers: list[JSONObject] = field(default_factory=list)
    promotions: list[Bundle] = field(default_factory=list)
    ab: list[Bundle] = field(default_factory=list)
