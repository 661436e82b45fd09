"""`evidence report`: the one-page HTML report of a qualification (or an A/B control).

The page draws on the transaction's verified bundle and, from the database, its decisions, the
waivers they cite or active now, and the promotions and A/B controls bound to its candidate,
each from its own verified bundle. The page is written atomically; nothing else changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from anvil_ctl.atomic import atomic_write
from anvil_ctl.bootstrap import App
from anvil_ctl.commands.evidence import evidence_tx_dir
from anvil_ctl.evidence.bundle import Bundle, ReportInputs
from anvil_ctl.evidence.plots import require_matplotlib
from anvil_ctl.evidence.report import render_page
from anvil_ctl.persistence import approvals, qualification, queries, waiver_rows


class BundleRef(TypedDict):
    """An evidence bundle the page was drawn from, bound by its manifest's SHA-256."""

    tx_id: str
    manifest_sha256: str


class ReportRecord(TypedDict):
    path: str
    tx_id: str
    bundles: list[BundleRef]
    size: int


@dataclass(frozen=True)
class ReportResult:
    path: str
    tx_id: str
    bundles: tuple[BundleRef, ...]
    size: int

    def as_dict(self) -> ReportRecord:
        return {"path": self.path, "tx_id": self.tx_id, "bundles": list(self.bundles), "size": self.size}


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
    for approval in approvals.approvals(store):
        if approval["decision_id"] in ids and (root / approval["tx_id"]).is_dir():
            inputs.promotions.append(Bundle.load(root / approval["tx_id"], approval["tx_id"]))
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
