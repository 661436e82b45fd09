"""The one-page report a person reads before promoting: one self-contained HTML file.

Every figure comes from verified evidence bundles (the qualification's, and the promotions' and
A/B controls' that name its candidate); records from the database are shown as records, and
external-prior figures get a box of their own. No network: inline CSS and SVG, no script.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from anvil_ctl.core.jsontypes import JSONMapping, JSONObject, fields, items, number, texts, whole
from anvil_ctl.evidence import plots
from anvil_ctl.evidence.bundle import Bundle, ReportInputs
from anvil_ctl.evidence.summary import context_label

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


def render_page(inputs: ReportInputs) -> str:
    """The whole page as one HTML document."""
    plots.require_matplotlib()
    q = inputs.qualification
    decision = fields(q.files.get("decision.json") or {})
    title = f"Qualification of {decision.get('served_model', q.tx_id)}"
    compared = q.files.get("ab-comparison.json")
    if not decision and compared:
        comparison = fields(compared)
        arms = fields(comparison["arms"])
        title = f"A/B control: {arms['A']} vs {arms['B']}"
        verdict = fields(comparison["verdict"])
        decision = {"outcome": verdict["outcome"], "profile": comparison.get("select", "")}
    sources = [q, *inputs.promotions, *inputs.ab]
    footer = "".join(
        f"<li><code>{escape(b.tx_id)}</code>: {len(b.files)} artifacts, "
        f"manifest sha256 <code>{b.manifest_sha256}</code>, verified</li>"
        for b in sources
    )
    parts = [
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
        for t, h in parts
    )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1><p class=sub>{badge(decision.get('outcome', 'unknown'))} &nbsp; "
        f"profile {escape(str(decision.get('profile', '')))} &nbsp; transaction {escape(q.tx_id)} "
        f"&nbsp; report made {now}</p>{body}<footer><p>Every figure on this page comes from these "
        "evidence bundles, each re-hashed against its manifest when the page was made:</p>"
        f"<ul>{footer}</ul></footer></main></body></html>\n"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(_text(v))}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def badge(word: object) -> str:
    """A verdict word as a colored badge (a non-string verdict shows as its text)."""
    text = str(word)
    return f'<span class="verdict {escape(text)}">{escape(text.upper())}</span>'


def _identity(q: Bundle) -> str:
    ident = fields(q.files.get("identity.json") or {})
    decision = fields(q.files.get("decision.json") or {})
    prov = fields(q.files.get("provenance.json") or {})
    served = fields(fields(q.files.get("00-served-identity.json", {})).get("evidence", {}))
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
        ("GPU roles", ", ".join(texts(ident.get("gpu_roles", []))) or "-"),
        ("identity digest (decisions bind to it)", decision.get("identity_digest")),
        ("profile", decision.get("profile")),
        ("qualification transaction", q.tx_id),
    ]
    return table(("field", "value"), rows)


def _decision(inputs: ReportInputs) -> str:
    raw = fields(inputs.qualification.files.get("decision.json") or {})
    decided = escape(str(raw.get("decided_at", "")))
    parts = [f"<p>{badge(raw.get('outcome', 'unknown'))} under the standing policy, decided {decided}</p>"]
    reasons = texts(raw.get("reasons"))
    parts.append(
        "<ul>" + "".join(f"<li>{escape(r)}</li>" for r in reasons) + "</ul>"
        if reasons
        else "<p>Every gate passed.</p>"
    )
    for d in inputs.decisions:
        if d.get("reclassifies"):
            used = escape(", ".join(texts(d.get("waiver_ids", []))) or "-")
            why = "".join(f"<br>{escape(r)}" for r in texts(d.get("reasons", [])))
            parts.append(
                f'<div class="box"><b>Reclassified</b> {badge(d["outcome"])} by decision '
                f"<code>{escape(str(d['id']))}</code> under waiver(s) {used}; "
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
            ", ".join(texts(w.get("roles"))) or w.get("recipe_digest"),
            w["approved_by"],
            w["reason"],
            w.get("expires_at") or "never",
            w.get("revoked_at") or "-",
        )
        for w in inputs.waivers
    ]
    return table(
        ("waiver", "policy", "value (MiB)", "scope", "approved by", "reason", "expires", "revoked"), rows
    )


def _gates(q: Bundle) -> str:
    decision = fields(q.files.get("decision.json") or {})
    results = {k: v for k, v in q.files.items() if k[:2].isdigit() and isinstance(v, dict) and "passed" in v}
    rows = []
    for item in items(decision.get("gates", [])):
        g = fields(item)
        empty: JSONObject = {}
        art = next((v for k, v in sorted(results.items()) if k.endswith(f"-{g['name']}.json")), empty)
        rows.append(
            (
                g["name"],
                g["kind"],
                "PASS" if g["passed"] else "FAIL",
                g["classification"],
                art.get("summary", ""),
                str(g.get("artifact_sha256") or "")[:12],
            )
        )
    return table(("gate", "kind", "verdict", "classification", "summary", "artifact sha256"), rows)


def _capacity(q: Bundle) -> str:
    series: dict[str, list[JSONMapping]] = {}
    cells_table = []
    for gate_type in ("capacity", "endurance"):
        art = q.gate(gate_type)
        if art is None:
            continue
        ev = fields(art["evidence"])
        cells = items(ev.get("cells")) if gate_type == "capacity" else [ev]
        for cell in map(fields, cells):
            if cell.get("skipped") or "concurrency" not in cell:
                continue
            label = f"C{cell['concurrency']}" + (" endurance" if gate_type == "endurance" else "")
            series.setdefault(label, []).append(cell)
            cells_table.append(
                (
                    f"{context_label(whole(cell['nominal_tokens']))} {label}",
                    cell.get("prompt_tokens_p50"),
                    cell.get("ttft_s_p50"),
                    cell.get("prefill_tps_p50"),
                    cell.get("decode_tps_p50"),
                    f"{cell.get('completed')}/{cell.get('requests')}",
                )
            )
    if not cells_table:
        return "<p>No capacity or endurance gate in this qualification.</p>"
    plot = f'<div class="plot">{plots.capacity_svg(series)}</div>'
    return plot + table(
        (
            "nominal context",
            "measured prompt p50",
            "TTFT p50 (s)",
            "prefill p50 (tok/s)",
            "decode p50 (tok/s)",
            "completed",
        ),
        cells_table,
        numeric=(1, 2, 3, 4),
    )


def _vram(inputs: ReportInputs) -> str:
    q = inputs.qualification
    bars: list[plots.VramBar] = []
    standing: int | None = None
    in_force: int | None = None
    ident = fields(q.files.get("identity.json") or {})
    names = {str(u).lower(): role for role, u in fields(ident.get("gpu_role_uuids") or {}).items()}
    reserve = q.gate("vram_reserve")
    for when, reading in (
        ("before the workload", fields(q.files.get("vram-before.json") or {})),
        ("after the workload", fields(reserve["evidence"]) if reserve else {}),
    ):
        if reading.get("cards"):
            cards = [fields(c) for c in items(reading["cards"])]
            bars.append((when, _free(cards)))
            standing = _mib(cards[0].get("reserve_mib", standing))
    rows: list[tuple[object, ...]] = []
    for p in inputs.promotions:
        for name, value in sorted(p.files.items()):
            if not name.startswith("vram-after-acceptance") or not fields(value).get("cards"):
                continue
            reading = fields(value)
            cards = [fields(c) for c in items(reading["cards"])]
            bars.append((f"after acceptance ({p.tx_id[:8]})", _free(cards)))
            names.update({str(c["uuid"]).lower(): str(c["role"]) for c in cards})
            in_force = _mib(cards[0]["threshold_mib"])
            standing = _mib(next(iter(fields(reading.get("standing_mib", {})).values()), standing))
            rows.extend(
                (
                    p.tx_id[:8],
                    c["role"],
                    c["free_mib"],
                    c["threshold_mib"],
                    "PASS" if c["passed"] else "FAIL",
                    ", ".join(texts(reading.get("waivers", []))) or "-",
                )
                for c in cards
            )
    if not bars:
        return "<p>No VRAM reading in this evidence (no GPU roles or no probe).</p>"
    uuids = sorted({u for _, free in bars for u in free})
    label_of = {u: names.get(u) or (u if len(u) <= 16 else u[:13] + "...") for u in uuids}
    labels = [label_of[u] for u in uuids]
    relabelled = [(when, {label_of[u]: v for u, v in free.items()}) for when, free in bars]
    html = f'<div class="plot narrow">{plots.vram_svg(labels, relabelled, standing, in_force)}</div>'
    readings = [(when, lab, free.get(u)) for when, free in bars for u, lab in zip(uuids, labels, strict=True)]
    html += table(("when", "card", "free MiB"), readings, numeric=(2,))
    if rows:
        html += "<p>After real-client acceptance, against the reserve in force (waivers applied):</p>"
        html += table(
            ("promotion", "role", "free MiB", "reserve in force", "verdict", "waivers"), rows, numeric=(2, 3)
        )
    return html


def _free(cards: Sequence[JSONMapping]) -> dict[str, int | None]:
    return {str(c["uuid"]).lower(): _mib(c["free_mib"]) for c in cards}


def _mib(value: object) -> int | None:
    """A MiB figure as the reading holds it (an integer); anything else is not drawn."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ab(inputs: ReportInputs) -> str:
    out = []
    for b in inputs.ab:
        comp = b.files.get("ab-comparison.json")
        declared = fields(b.files.get("00-declaration.json") or {})
        if not comp:
            continue
        comparison = fields(comp)
        names = fields(comparison["arms"])
        rows = [_ab_row(fields(c)) for c in items(comparison["cells"]) if not fields(c).get("skipped")]
        verdict = fields(comparison["verdict"])
        bounds = "; ".join(str(fields(x)["text"]) for x in items(declared.get("boundaries", []))) or "none"
        digest = escape(str(declared.get("digest", ""))[:16])
        out.append(
            f"<p>Transaction <code>{escape(b.tx_id)}</code>: A = <b>{escape(str(names['A']))}</b>, "
            f"B = <b>{escape(str(names['B']))}</b>; boundaries declared before the first request "
            f"(digest <code>{digest}</code>): {escape(bounds)}</p>"
            f'<div class="plot">{plots.ab_svg(comparison)}</div>'
            + table(
                ("cell", "A decode p50", "B decode p50", "delta", "A prefill p50", "B prefill p50", "delta"),
                rows,
                numeric=(1, 2, 3, 4, 5, 6),
            )
            + f"<p>{badge(verdict['outcome'])} {escape(str(verdict['summary']))}</p>"
        )
    return "".join(out) or "<p>No A/B control names this candidate.</p>"


def _ab_row(c: JSONMapping) -> tuple[object, ...]:
    """One measured cell of a comparison: each arm's decode and prefill p50 and the deltas."""
    a, b, delta = fields(c["A"]), fields(c["B"]), fields(c["delta_pct"])
    decode, prefill = ((a[m], b[m], _pct(number(delta[m]))) for m in ("decode_p50", "prefill_p50"))
    return (c["label"], *decode, *prefill)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _provenance(q: Bundle) -> str:
    prov = fields(q.files.get("provenance.json") or {})
    source = fields(prov.get("source") or {})
    html = ""
    if source:
        keys = ("repository", "release", "commit", "image_tag", "image_digest", "url", "notes")
        html += table(("source field", "as published"), [(k, source.get(k)) for k in keys if source.get(k)])
    external = [fields(e) for e in items(prov.get("external_prior"))]
    if external:
        listed = "".join(
            f"<li><b>{escape(str(e.get('figure', '')))}</b>: {escape(str(e.get('conditions', '')))} "
            f"({escape(str(e.get('where', '')))})</li>"
            for e in external
        )
        html += (
            '<div class="box external"><h3>External-prior evidence: published by the source, '
            f"NOT measured here</h3><ul>{listed}</ul>"
            "These figures are not local results and appear in no table or plot above.</div>"
        )
    local = texts(fields(prov.get("local_measurements") or {}).get("artifacts"))
    html += f"<p>Local measurements in this bundle: {escape(', '.join(local)) or '-'}.</p>"
    return html
