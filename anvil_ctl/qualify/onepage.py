"""The one-page report a person reads before promoting: one self-contained HTML file.

Everything on the page that is a figure comes from verified evidence bundles: the
qualification's own, and the bundles of the promotions and A/B controls that name
its candidate. Records that are not figures (a later reclassification, the waivers)
come from the state database and are shown as records. External-prior figures (the
recipe source's published claims) get a box of their own and never enter a table or
plot of local results.

No network: inline CSS, inline SVG plots (`anvil_ctl.qualify.plots`), no script,
no link, no font or image fetched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from anvil_ctl.core.errors import EvidenceMismatch
from anvil_ctl.qualify import plots
from anvil_ctl.qualify.evidence import read_manifest, verify_bundle
from anvil_ctl.qualify.metrics import context_label

CSS = " ".join(
    (
        'body{font:14px/1.45 "DejaVu Sans","Liberation Sans",Arial,sans-serif;color:#1d2430;',
        "margin:0;background:#f4f5f7}",
        "main{max-width:1120px;margin:0 auto;padding:24px 28px;background:#fff}",
        "h1{font-size:22px;margin:0 0 4px}",
        "h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #dde1e6;padding-bottom:4px}",
        ".sub{color:#5b6675}table{border-collapse:collapse;width:100%;margin:6px 0}",
        "td,th{border-bottom:1px solid #e6e9ee;padding:4px 8px;text-align:left;vertical-align:top;",
        "font-size:13px}th{background:#f0f2f5;font-weight:600}",
        "td.n{text-align:right;font-variant-numeric:tabular-nums}",
        ".verdict{display:inline-block;padding:4px 12px;border-radius:4px;font-weight:700;color:#fff}",
        ".verified,.selected,.pass{background:#2e7d32}",
        ".policy-infeasible,.boundary-violated,.no-difference{background:#c77700}",
        ".failed,.fail,.incomplete,.unknown{background:#b3261e}",
        ".box{border:1px solid #dde1e6;border-radius:6px;padding:10px 14px;margin:8px 0}",
        ".external{border:2px dashed #8e44ad;background:#faf5fc}",
        ".external h3{color:#6c2e8a;margin:0 0 6px;font-size:14px}",
        ".plot svg{width:100%;height:auto}.plot.narrow svg{max-width:760px}",
        "code{font-size:12px;background:#f0f2f5;padding:0 3px}",
        "footer{color:#5b6675;font-size:12px;margin-top:24px}",
    )
)


@dataclass(frozen=True)
class Bundle:
    """One verified evidence directory and its JSON artifacts."""

    tx_id: str
    directory: Path
    manifest_sha256: str
    files: dict[str, Any]

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
        manifest = read_manifest(directory)
        files = {
            str(a["path"]): json.loads((directory / str(a["path"])).read_text())
            for a in manifest["artifacts"]
            if str(a["path"]).endswith(".json")
        }
        digest = hashlib.sha256((directory / "manifest.json").read_bytes()).hexdigest()
        return cls(tx_id or str(manifest.get("tx_id", directory.name)), directory, digest, files)

    def gate(self, gate_type: str) -> dict[str, Any] | None:
        return next(
            (
                v
                for k, v in sorted(self.files.items())
                if isinstance(v, dict) and v.get("evidence", {}).get("gate_type") == gate_type
            ),
            None,
        )


@dataclass
class ReportInputs:
    qualification: Bundle
    decisions: list[dict[str, Any]] = field(default_factory=list)
    waivers: list[dict[str, Any]] = field(default_factory=list)
    promotions: list[Bundle] = field(default_factory=list)
    ab: list[Bundle] = field(default_factory=list)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(_text(v))}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _badge(word: str) -> str:
    return f'<span class="verdict {escape(word)}">{escape(word.upper())}</span>'


def _identity(q: Bundle) -> str:
    ident = q.files.get("identity.json") or {}
    decision = q.files.get("decision.json") or {}
    prov = q.files.get("provenance.json") or {}
    served = q.files.get("00-served-identity.json", {}).get("evidence", {})
    rows = [
        ("served model", decision.get("served_model") or ident.get("served_model")),
        ("recipe", prov.get("recipe")),
        ("engine", prov.get("engine")),
        ("model identity", ident.get("model_identity") or "-"),
        ("image ID", ident.get("image_id")),
        ("container", ident.get("container_id")),
        ("config fingerprint", ident.get("config_fingerprint")),
        ("context tokens", ident.get("context_tokens") or served.get("max_model_len")),
        ("binding / slot", f"{ident.get('binding', '-')} / {ident.get('slot', '-')}"),
        ("GPU roles", ", ".join(ident.get("gpu_roles", [])) or "-"),
        ("identity digest (decisions bind to it)", decision.get("identity_digest")),
        ("profile", decision.get("profile")),
        ("qualification transaction", q.tx_id),
    ]
    return _table(("field", "value"), rows)


def _decision(inputs: ReportInputs) -> str:
    raw = inputs.qualification.files.get("decision.json") or {}
    decided = escape(str(raw.get("decided_at", "")))
    parts = [f"<p>{_badge(raw.get('outcome', 'unknown'))} under the standing policy, decided {decided}</p>"]
    reasons = raw.get("reasons") or []
    parts.append(
        "<ul>" + "".join(f"<li>{escape(r)}</li>" for r in reasons) + "</ul>"
        if reasons
        else "<p>Every gate passed.</p>"
    )
    for d in inputs.decisions:
        if d.get("reclassifies"):
            used = escape(", ".join(d.get("waiver_ids", [])) or "-")
            why = "".join(f"<br>{escape(r)}" for r in d.get("reasons", []))
            parts.append(
                f'<div class="box"><b>Reclassified</b> {_badge(d["outcome"])} by decision '
                f"<code>{escape(d['id'])}</code> under waiver(s) {used}; "
                f"the raw evidence is unchanged.{why}</div>"
            )
    return "".join(parts)


def _waivers(inputs: ReportInputs) -> str:
    if not inputs.waivers:
        return "<p>No waiver in force or referenced.</p>"
    rows = [
        (
            w["id"],
            w["policy"],
            w["value"],
            ", ".join(w.get("roles") or []) or w.get("recipe_digest"),
            w["approved_by"],
            w["reason"],
            w.get("expires_at") or "never",
            w.get("revoked_at") or "-",
        )
        for w in inputs.waivers
    ]
    return _table(
        ("waiver", "policy", "value (MiB)", "scope", "approved by", "reason", "expires", "revoked"), rows
    )


def _gates(q: Bundle) -> str:
    decision = q.files.get("decision.json") or {}
    results = {k: v for k, v in q.files.items() if k[:2].isdigit() and isinstance(v, dict) and "passed" in v}
    rows = []
    for g in decision.get("gates", []):
        art = next((v for k, v in sorted(results.items()) if k.endswith(f"-{g['name']}.json")), {})
        rows.append(
            (
                g["name"],
                g["kind"],
                "PASS" if g["passed"] else "FAIL",
                g["classification"],
                art.get("summary", ""),
                (g.get("artifact_sha256") or "")[:12],
            )
        )
    return _table(("gate", "kind", "verdict", "classification", "summary", "artifact sha256"), rows)


def _capacity(q: Bundle) -> str:
    series: dict[str, plots.Series] = {}
    table = []
    for gate_type in ("capacity", "endurance"):
        art = q.gate(gate_type)
        if art is None:
            continue
        ev = art["evidence"]
        cells = ev.get("cells") if gate_type == "capacity" else [ev]
        for cell in cells or []:
            if cell.get("skipped") or "concurrency" not in cell:
                continue
            label = f"C{cell['concurrency']}" + (" endurance" if gate_type == "endurance" else "")
            s = series.setdefault(label, plots.Series(label))
            s.p50_x.append(cell.get("prompt_tokens_p50") or 0)
            for key, _, _ in plots.CAPACITY_METRICS:
                s.p50.setdefault(key, []).append(cell.get(f"{key}_p50"))
                s.points.setdefault(key, []).extend(
                    (r["prompt_tokens"], r[key])
                    for r in cell.get("rows", [])
                    if r.get("completed") and r.get(key) is not None and r.get("prompt_tokens")
                )
            table.append(
                (
                    f"{context_label(cell['nominal_tokens'])} {label}",
                    cell.get("prompt_tokens_p50"),
                    cell.get("ttft_s_p50"),
                    cell.get("prefill_tps_p50"),
                    cell.get("decode_tps_p50"),
                    f"{cell.get('completed')}/{cell.get('requests')}",
                )
            )
    if not table:
        return "<p>No capacity or endurance gate in this qualification.</p>"
    plot = f'<div class="plot">{plots.capacity_svg(list(series.values()))}</div>'
    return plot + _table(
        (
            "nominal context",
            "measured prompt p50",
            "TTFT p50 (s)",
            "prefill p50 (tok/s)",
            "decode p50 (tok/s)",
            "completed",
        ),
        table,
        numeric=(1, 2, 3, 4),
    )


def _vram(inputs: ReportInputs) -> str:
    q = inputs.qualification
    bars: list[plots.VramBar] = []
    standing: int | None = None
    in_force: int | None = None
    ident = q.files.get("identity.json") or {}
    names = {u.lower(): role for role, u in (ident.get("gpu_role_uuids") or {}).items()}
    before = q.files.get("vram-before.json")
    if before and before.get("cards"):
        bars.append(
            plots.VramBar("before the workload", {c["uuid"].lower(): c["free_mib"] for c in before["cards"]})
        )
        standing = before["cards"][0].get("reserve_mib")
    reserve = q.gate("vram_reserve")
    if reserve and reserve["evidence"].get("cards"):
        cards = reserve["evidence"]["cards"]
        bars.append(plots.VramBar("after the workload", {c["uuid"].lower(): c["free_mib"] for c in cards}))
        standing = cards[0].get("reserve_mib", standing)
    rows: list[tuple[Any, ...]] = []
    for p in inputs.promotions:
        for name, reading in sorted(p.files.items()):
            if not name.startswith("vram-after-acceptance") or not reading.get("cards"):
                continue
            bars.append(
                plots.VramBar(
                    f"after acceptance ({p.tx_id[:8]})",
                    {c["uuid"].lower(): c["free_mib"] for c in reading["cards"]},
                )
            )
            names.update({c["uuid"].lower(): c["role"] for c in reading["cards"]})
            in_force = reading["cards"][0]["threshold_mib"]
            standing = next(iter(reading.get("standing_mib", {}).values()), standing)
            rows.extend(
                (
                    p.tx_id[:8],
                    c["role"],
                    c["free_mib"],
                    c["threshold_mib"],
                    "PASS" if c["passed"] else "FAIL",
                    ", ".join(reading.get("waivers", [])) or "-",
                )
                for c in reading["cards"]
            )
    if not bars:
        return "<p>No VRAM reading in this evidence (no GPU roles or no probe).</p>"
    cards = sorted({u for b in bars for u in b.free_mib})
    label_of = {u: names.get(u) or (u if len(u) <= 16 else u[:13] + "...") for u in cards}
    labels = [label_of[u] for u in cards]
    relabelled = [plots.VramBar(b.label, {label_of[u]: v for u, v in b.free_mib.items()}) for b in bars]
    html = f'<div class="plot narrow">{plots.vram_svg(labels, relabelled, standing, in_force)}</div>'
    table = [(b.label, lab, b.free_mib.get(u)) for b in bars for u, lab in zip(cards, labels, strict=True)]
    html += _table(("when", "card", "free MiB"), table, numeric=(2,))
    if rows:
        html += "<p>After real-client acceptance, against the reserve in force (waivers applied):</p>"
        html += _table(
            ("promotion", "role", "free MiB", "reserve in force", "verdict", "waivers"), rows, numeric=(2, 3)
        )
    return html


def _ab(inputs: ReportInputs) -> str:
    out = []
    for b in inputs.ab:
        comp = b.files.get("ab-comparison.json")
        declared = b.files.get("00-declaration.json") or {}
        if not comp:
            continue
        names = comp["arms"]
        rows = [
            (
                c["label"],
                c["A"]["decode_p50"],
                c["B"]["decode_p50"],
                _pct(c["delta_pct"]["decode_p50"]),
                c["A"]["prefill_p50"],
                c["B"]["prefill_p50"],
                _pct(c["delta_pct"]["prefill_p50"]),
            )
            for c in comp["cells"]
            if not c.get("skipped")
        ]
        verdict = comp["verdict"]
        bounds = "; ".join(x["text"] for x in declared.get("boundaries", [])) or "none"
        digest = escape(str(declared.get("digest", ""))[:16])
        out.append(
            f"<p>Transaction <code>{escape(b.tx_id)}</code>: A = <b>{escape(names['A'])}</b>, "
            f"B = <b>{escape(names['B'])}</b>; boundaries declared before the first request "
            f"(digest <code>{digest}</code>): {escape(bounds)}</p>"
            f'<div class="plot">{plots.ab_svg(comp)}</div>'
            + _table(
                ("cell", "A decode p50", "B decode p50", "delta", "A prefill p50", "B prefill p50", "delta"),
                rows,
                numeric=(1, 2, 3, 4, 5, 6),
            )
            + f"<p>{_badge(verdict['outcome'])} {escape(verdict['summary'])}</p>"
        )
    return "".join(out) or "<p>No A/B control names this candidate.</p>"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _provenance(q: Bundle) -> str:
    prov = q.files.get("provenance.json") or {}
    source = prov.get("source") or {}
    html = ""
    if source:
        keys = ("repository", "release", "commit", "image_tag", "image_digest", "url", "notes")
        html += _table(("source field", "as published"), [(k, source.get(k)) for k in keys if source.get(k)])
    external = prov.get("external_prior") or []
    if external:
        items = "".join(
            f"<li><b>{escape(e.get('figure', ''))}</b>: {escape(e.get('conditions', ''))} "
            f"({escape(e.get('where', ''))})</li>"
            for e in external
        )
        html += (
            '<div class="box external"><h3>External-prior evidence: published by the source, '
            f"NOT measured here</h3><ul>{items}</ul>"
            "These figures are not local results and appear in no table or plot above.</div>"
        )
    local = (prov.get("local_measurements") or {}).get("artifacts") or []
    html += f"<p>Local measurements in this bundle: {escape(', '.join(local)) or '-'}.</p>"
    return html


def render_page(inputs: ReportInputs) -> str:
    """The whole page as one HTML document."""
    plots.require_matplotlib()
    q = inputs.qualification
    decision = q.files.get("decision.json") or {}
    title = f"Qualification of {decision.get('served_model', q.tx_id)}"
    sources = [q, *inputs.promotions, *inputs.ab]
    footer = "".join(
        f"<li><code>{escape(b.tx_id)}</code>: {len(b.files)} artifacts, "
        f"manifest sha256 <code>{b.manifest_sha256}</code>, verified</li>"
        for b in sources
    )
    sections = [
        ("Identity", _identity(q)),
        ("Decision", _decision(inputs)),
        ("Waivers", _waivers(inputs)),
        ("Gates", _gates(q)),
        ("Capacity: TTFT, prefill and decode against measured prompt tokens", _capacity(q)),
        ("VRAM against the reserve", _vram(inputs)),
        ("Matched A/B control", _ab(inputs)),
        ("Provenance", _provenance(q)),
    ]
    body = "".join(
        f'<section id="{escape(t.split(":")[0].lower().replace(" ", "-"))}"><h2>{escape(t)}</h2>{h}</section>'
        for t, h in sections
    )
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1><p class=sub>{_badge(decision.get('outcome', 'unknown'))} &nbsp; "
        f"profile {escape(str(decision.get('profile', '')))} &nbsp; transaction {escape(q.tx_id)} "
        f"&nbsp; report made {now}</p>{body}<footer><p>Every figure on this page comes from these "
        "evidence bundles, each re-hashed against its manifest when the page was made:</p>"
        f"<ul>{footer}</ul></footer></main></body></html>\n"
    )
