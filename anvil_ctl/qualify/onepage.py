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

from datetime import UTC, datetime
from html import escape

from anvil_ctl.qualify import plots, sections
from anvil_ctl.qualify.bundle import Bundle, ReportInputs
from anvil_ctl.qualify.narrow import fields

__all__ = ["Bundle", "ReportInputs", "render_page"]

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
        ("Identity", sections.identity(q)),
        ("Decision", sections.decision(inputs)),
        ("Waivers", sections.waivers(inputs)),
        ("Gates", sections.gates(q)),
        ("Capacity: TTFT, prefill and decode against measured prompt tokens", sections.capacity(q)),
        ("VRAM against the reserve", sections.vram(inputs)),
        ("Matched A/B control", sections.ab(inputs)),
        ("Provenance", sections.provenance(q)),
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
        f"<h1>{escape(title)}</h1><p class=sub>{sections.badge(decision.get('outcome', 'unknown'))} &nbsp; "
        f"profile {escape(str(decision.get('profile', '')))} &nbsp; transaction {escape(q.tx_id)} "
        f"&nbsp; report made {now}</p>{body}<footer><p>Every figure on this page comes from these "
        "evidence bundles, each re-hashed against its manifest when the page was made:</p>"
        f"<ul>{footer}</ul></footer></main></body></html>\n"
    )
