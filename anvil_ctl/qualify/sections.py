"""The sections of the one-page report, each rendered as HTML from verified bundles.

Helpers escape every value; numbers get thousands separators. The plots come from
`anvil_ctl.qualify.plots`; the page around the sections from `anvil_ctl.qualify.onepage`.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from anvil_ctl.qualify import plots
from anvil_ctl.qualify.bundle import Bundle, ReportInputs
from anvil_ctl.qualify.metrics import context_label


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
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


def badge(word: str) -> str:
    return f'<span class="verdict {escape(word)}">{escape(word.upper())}</span>'


def identity(q: Bundle) -> str:
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
    return table(("field", "value"), rows)


def decision(inputs: ReportInputs) -> str:
    raw = inputs.qualification.files.get("decision.json") or {}
    decided = escape(str(raw.get("decided_at", "")))
    parts = [f"<p>{badge(raw.get('outcome', 'unknown'))} under the standing policy, decided {decided}</p>"]
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
                f'<div class="box"><b>Reclassified</b> {badge(d["outcome"])} by decision '
                f"<code>{escape(d['id'])}</code> under waiver(s) {used}; "
                f"the raw evidence is unchanged.{why}</div>"
            )
    return "".join(parts)


def waivers(inputs: ReportInputs) -> str:
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
    return table(
        ("waiver", "policy", "value (MiB)", "scope", "approved by", "reason", "expires", "revoked"), rows
    )


def gates(q: Bundle) -> str:
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
    return table(("gate", "kind", "verdict", "classification", "summary", "artifact sha256"), rows)


def capacity(q: Bundle) -> str:
    series: dict[str, plots.Series] = {}
    cells_table = []
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
            cells_table.append(
                (
                    f"{context_label(cell['nominal_tokens'])} {label}",
                    cell.get("prompt_tokens_p50"),
                    cell.get("ttft_s_p50"),
                    cell.get("prefill_tps_p50"),
                    cell.get("decode_tps_p50"),
                    f"{cell.get('completed')}/{cell.get('requests')}",
                )
            )
    if not cells_table:
        return "<p>No capacity or endurance gate in this qualification.</p>"
    plot = f'<div class="plot">{plots.capacity_svg(list(series.values()))}</div>'
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


def vram(inputs: ReportInputs) -> str:
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
    readings = [(b.label, lab, b.free_mib.get(u)) for b in bars for u, lab in zip(cards, labels, strict=True)]
    html += table(("when", "card", "free MiB"), readings, numeric=(2,))
    if rows:
        html += "<p>After real-client acceptance, against the reserve in force (waivers applied):</p>"
        html += table(
            ("promotion", "role", "free MiB", "reserve in force", "verdict", "waivers"), rows, numeric=(2, 3)
        )
    return html


def ab(inputs: ReportInputs) -> str:
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
            + table(
                ("cell", "A decode p50", "B decode p50", "delta", "A prefill p50", "B prefill p50", "delta"),
                rows,
                numeric=(1, 2, 3, 4, 5, 6),
            )
            + f"<p>{badge(verdict['outcome'])} {escape(verdict['summary'])}</p>"
        )
    return "".join(out) or "<p>No A/B control names this candidate.</p>"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def provenance(q: Bundle) -> str:
    prov = q.files.get("provenance.json") or {}
    source = prov.get("source") or {}
    html = ""
    if source:
        keys = ("repository", "release", "commit", "image_tag", "image_digest", "url", "notes")
        html += table(("source field", "as published"), [(k, source.get(k)) for k in keys if source.get(k)])
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
