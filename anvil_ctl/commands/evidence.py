"""Evidence commands: export a shareable bundle, verify a directory, the one-page report, and
the audit reads.

Exports redact host paths, GPU UUIDs and router tokens and record the export's manifest;
verifying holds a directory against its manifest and the manifest against the database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from anvil_ctl.adapters.credentials import TokenKind, resolve_token
from anvil_ctl.atomic import atomic_write
from anvil_ctl.bootstrap import App
from anvil_ctl.commands.recipes import recipe_search
from anvil_ctl.core.errors import AnvilError, BadInput, CredentialError
from anvil_ctl.core.validate import require_limit
from anvil_ctl.evidence.bundle import (
    Bundle,
    ExportResult,
    ManifestReference,
    Redaction,
    ReportInputs,
    VerifyResult,
    export_bundle,
    read_manifest,
    verify_bundle,
)
from anvil_ctl.evidence.plots import require_matplotlib
from anvil_ctl.evidence.report import render_page
from anvil_ctl.persistence import qualification, queries, waiver_rows
from anvil_ctl.persistence.head import database_file
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.qualify.profiles import PROFILES_DIR


def evidence_tx_dir(app: App, tx: str) -> Path:
    """The evidence directory of transaction `tx` (an ID or a unique prefix)."""
    root = app.settings.evidence_dir
    found = sorted(p for p in root.glob(f"{tx}*") if p.is_dir()) if tx and root.is_dir() else []
    if len(found) != 1:
        raise BadInput(
            f"evidence of transaction {tx!r}: {'no match' if not found else 'ambiguous prefix'} in {root}",
            field="transaction",
        )
    return found[0]


def router_secrets(app: App) -> tuple[str, ...]:
    """The router tokens resolvable here: what evidence must never contain."""
    return _redaction(app).secrets


def _redaction(app: App) -> Redaction:
    secrets: list[str] = []
    rc = app.config.router
    if rc.kind != "none":
        tokens: tuple[tuple[TokenKind, str], ...] = (
            ("client", rc.client_token_env),
            ("admin", rc.admin_token_env),
        )
        for kind, env_name in tokens:
            try:
                token = resolve_token(kind, env_name, app.env, rc.credential_file)
            except (CredentialError, BadInput):
                continue  # not resolvable here: then nothing of it can be redacted either
            secrets.append(token.reveal())
    try:  # the recipe search's directories, as far as they can be read
        recipe_dirs = [d.path for d in recipe_search(app)]
    except AnvilError:
        recipe_dirs = [p for p in (app.settings.recipes_dir,) if p is not None]
    paths = [str(p.resolve()) for p in (app.settings.state_dir, app.settings.evidence_dir, *recipe_dirs)]
    # Where the package's profiles live (a decision names its profile's file) is a host path too.
    paths.append(str(PROFILES_DIR.parent.parent))
    home = app.env.get("HOME", "")
    if home.strip("/"):
        paths.append(home)
    return Redaction(secrets=tuple(secrets), paths=tuple(paths))


def export_evidence(app: App, tx: str, out_dir: Path) -> ExportResult:
    """A shareable bundle of `tx`'s evidence, redacted; the source must be what the database
    recorded for `tx`, and the export's manifest SHA-256 is recorded too."""
    tx_dir = evidence_tx_dir(app, tx)
    references = (_database_reference(app, tx_dir.name),)
    result = export_bundle(tx_dir, out_dir, redact=_redaction(app), references=references)
    qualification.record_manifest(
        app.store,
        tx_dir.name,
        result.manifest.sha256,
        kind="export",
        source_sha256=result.source_manifest_sha256,
    )
    return replace(result, recorded=True)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _database_reference(app: App, tx_id: str) -> ManifestReference:
    """What the state database recorded for `tx_id`'s manifests, or a note why it cannot say
    (a missing SQLite file is not created)."""
    db_file = database_file(app.settings.db_url)
    if db_file is not None and not db_file.is_file():
        return ManifestReference("database", (), f"no state database at {db_file}")
    try:
        found = qualification.manifests(app.store, tx_id)
    except AnvilError as exc:  # not initialised, foreign, unreachable: no answer from it
        return ManifestReference("database", (), f"state database unusable: {exc}")
    if not found:
        return ManifestReference("database", (), f"no manifest recorded for transaction {tx_id}")
    return ManifestReference("database", tuple(m.sha256 for m in found))


def verify_evidence(app: App, directory: Path, *, expect_manifest: str | None = None) -> VerifyResult:
    """Check `directory` against its manifest, and the manifest against what was recorded:
    the state database (when there is one) and `expect_manifest` (a SHA-256 printed at export)."""
    references: list[ManifestReference] = []
    if expect_manifest is not None:
        if not _SHA256.match(expect_manifest):
            raise BadInput(
                f"--expect-manifest: expected 64 lowercase hex digits, got {expect_manifest!r}",
                field="expect_manifest",
            )
        references.append(ManifestReference("--expect-manifest", (expect_manifest,)))
    try:
        tx_id = str(read_manifest(directory)[0].get("tx_id") or "")
    except BadInput:
        tx_id = ""  # verify_bundle names what is wrong with the manifest
    if tx_id:
        references.insert(0, _database_reference(app, tx_id))
    return verify_bundle(directory, references)


def audit_decisions(app: App, *, slot: str | None = None, limit: int = 50) -> list[DecisionRecord]:
    """The newest `limit` qualify decisions (reclassifications included), oldest first:
    `ix_decisions_at` finds them without reading every decision recorded."""
    limit = require_limit(limit)
    newest = qualification.decisions(app.store, slot=slot, newest_first=True, limit=limit)
    return newest[::-1]


def audit_evidence(app: App, tx: str) -> dict[str, object]:
    """`audit evidence`: `tx`'s gate rows from the database (`gates`) and its directory checked
    against the manifest (`verify`)."""
    tx_dir = evidence_tx_dir(app, tx)
    return {
        "tx_id": tx_dir.name,
        "gates": qualification.evidence(app.store, tx_dir.name),
        "verify": verify_bundle(tx_dir, (_database_reference(app, tx_dir.name),)).as_dict(),
    }


class BundleRef(TypedDict):
    """An evidence bundle the page was drawn from, bound by its manifest's SHA-256."""

    tx_id: str
    manifest_sha256: str


@dataclass(frozen=True)
class ReportResult:
    path: str
    tx_id: str
    bundles: tuple[BundleRef, ...]
    size: int


def evidence_report(app: App, tx: str, out: Path | None = None) -> ReportResult:
    """Write the one-page report of transaction `tx` (ID, prefix or evidence directory)."""
    require_matplotlib()
    given = Path(tx)
    tx_dir = given if given.is_dir() else evidence_tx_dir(app, tx)
    main = Bundle.load(tx_dir)
    inputs = ReportInputs(main)
    if "ab-comparison.json" in main.files:
        inputs.ab.append(main)
    if not given.is_dir():  # a transaction of this database: its records belong on the page
        _records(app, inputs)
    page = render_page(inputs)
    path = out or app.settings.state_dir / "reports" / f"{main.tx_id}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, page)
    bundles = tuple(
        BundleRef(tx_id=b.tx_id, manifest_sha256=b.manifest_sha256)
        for b in (main, *inputs.promotions, *[a for a in inputs.ab if a is not main])
    )
    return ReportResult(str(path), main.tx_id, bundles, len(page.encode()))


def _records(app: App, inputs: ReportInputs) -> None:
    store, root = app.store, app.settings.evidence_dir
    tx_id = inputs.qualification.tx_id
    raw = qualification.decisions_of_tx(store, tx_id)
    decisions = raw + qualification.reclassifications(store, {d["id"] for d in raw})
    inputs.decisions = list(decisions)
    ids = {d["id"] for d in decisions}
    cited = {w for d in decisions for w in d["waiver_ids"]}
    now = datetime.now(UTC)
    inputs.waivers = [w.as_dict() for w in waiver_rows.waivers(store) if w.id in cited or w.active(now)]
    for approval in qualification.approvals(store):
        if approval.decision_id in ids and (root / approval.tx_id).is_dir():
            inputs.promotions.append(Bundle.load(root / approval.tx_id, approval.tx_id))
    digests = {d["identity_digest"] for d in raw}
    for t in queries.transactions(store, kind="ab", limit=10_000, host=store.host):
        declared = root / t["tx_id"] / "00-declaration.json"
        if t["tx_id"] == tx_id or not declared.is_file():
            continue
        # Which arms it compared decides only whether it belongs here; its figures are read
        # from the bundle once verified (a tampered one stops the report).
        arms = json.loads(declared.read_text()).get("arms", [])
        if any(a.get("identity", {}).get("qualification_digest") in digests for a in arms):
            inputs.ab.append(Bundle.load(declared.parent, t["tx_id"]))
