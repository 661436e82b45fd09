"""Human renderings of recipes, qualification, evidence, claims and GPUs (see `render`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anvil_ctl.cli import views
from anvil_ctl.cli.output import Out, lines_of, s
from anvil_ctl.cli.render_tx import outcome
from anvil_ctl.cli.views import items, record, records
from anvil_ctl.core.jsontypes import number
from anvil_ctl.core.validate import escape_text

if TYPE_CHECKING:
    from anvil_ctl.commands.evidence import ReportResult
    from anvil_ctl.commands.qualify import AbOutcome, QualifyOutcome
    from anvil_ctl.commands.recipes import Plan, RecipeView, ValidationReport
    from anvil_ctl.evidence.bundle import ExportResult, VerifyResult
    from anvil_ctl.evidence.claims import ClaimsCheck


def recipe_view(r: RecipeView, out: Out) -> None:
    out.line(f"recipe {s(r.name)} ({s(r.path)})")
    out.line(f"  digest    {s(r.digest)}")
    out.line(f"  runnable  {'yes' if r.runnable else 'no'}")
    for text in lines_of(r.recipe, "  "):
        out.line(text)


def validation(r: ValidationReport, out: Out) -> None:
    out.line(f"ok: recipe {s(r.name)} ({s(r.path)}) is valid; digest {s(r.digest)}")
    out.line(f"  runnable  {'yes' if r.runnable else 'no'}")
    if r.checked_slot:
        out.line(f"  fits slot {s(r.checked_slot)}")
    if r.unknown:
        out.line(f"  unknown   {', '.join(s(u) for u in r.unknown)}")
    if r.assumed:
        out.line(f"  assumed   {', '.join(s(a) for a in r.assumed)}")


def recipe_plan(p: Plan, out: Out) -> None:
    out.line(f"plan of recipe {s(p.recipe)} for slot {s(p.slot)} ({s(p.path)}); nothing was touched")
    out.line(f"  digest              {s(p.digest)}")
    out.line(f"  config fingerprint  {s(p.config_fingerprint)}")
    out.line(f"  runnable            {'yes' if p.runnable else 'no'}")
    if p.unknown:
        out.line(f"  unknown             {', '.join(s(u) for u in p.unknown)}")
    out.line("  container spec:")
    for text in lines_of(p.spec, "    "):
        out.line(text)


def qualify(q: QualifyOutcome, out: Out) -> None:
    result, decision = q.result, q.decision
    if result is None or decision is None:  # refused, or the candidate changed: no decision
        outcome(q.outcome, out)
        return
    from anvil_ctl.evidence.summary import render_summary, summary_table
    from anvil_ctl.qualify.runner import render_gates

    out.line(f"qualify: profile {s(result.profile)}, {s(result.served_model)} at {s(result.base_url)}")
    out.line()
    if result.summary:
        if out.width is not None:  # a terminal: rich draws the table
            from rich.console import Console

            console = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)
            console.print(summary_table(result.summary, title="Capacity and endurance"))
        else:
            out.line(escape_text(render_summary(result.summary), keep_newlines=True))
        out.line()
    out.line(escape_text(render_gates(result.gates), keep_newlines=True))
    out.line()
    out.line(f"DECISION: {s(decision['outcome'].upper())}  (standing policy)")
    out.line(f"  decision     {s(decision['id'])}  transaction {s(q.outcome.tx_id)}")
    out.line(f"  identity     {s(decision['identity_digest'])}  container {s(decision['container_id'][:12])}")
    for reason in decision["reasons"]:
        out.line(f"  reason       {s(reason)}")
    if q.reclassified:
        rec = q.reclassified
        out.line(
            f"RECLASSIFIED: {s(rec['outcome'].upper())} under waiver(s) "
            f"{', '.join(s(w) for w in rec['waiver_ids']) or '-'}  (decision {s(rec['id'])} "
            f"reclassifies {s(decision['id'])})"
        )
    out.line(f"  evidence     {s(result.tx_dir)}  manifest sha256 {s(result.manifest.sha256)}")


def ab(a: AbOutcome, out: Out) -> None:
    if a.comparison is None:
        outcome(a.outcome, out)
        return
    c = a.comparison
    names = record(c["arms"])
    out.line(f"A/B control (transaction {a.outcome.tx_id}): A = {s(names['A'])}, B = {s(names['B'])}")
    out.line(f"  declared before the first request: digest {s(c.get('declaration_digest'))}")
    out.line()
    columns = ["Nominal context", "A decode p50", "B decode p50", "Delta", "A prefill p50", "B prefill p50"]
    rows: list[tuple[str, ...]] = []

    def num(value: object, digits: int, unit: str) -> str:
        return "-" if (n := number(value)) is None else f"{n:,.{digits}f}{unit}"

    def delta(value: object) -> str:
        return "-" if (n := number(value)) is None else f"{n:+.1f}%"

    for cell in records(c["cells"]):
        if cell.get("skipped"):
            rows.append((s(cell["label"]), "skipped", "", "", "", "", ""))
            continue
        arm_a, arm_b, diff = record(cell["A"]), record(cell["B"]), record(cell["delta_pct"])
        rows.append(
            (
                s(cell["label"]),
                num(arm_a["decode_p50"], 2, " tok/s"),
                num(arm_b["decode_p50"], 2, " tok/s"),
                delta(diff["decode_p50"]),
                num(arm_a["prefill_p50"], 0, " tok/s"),
                num(arm_b["prefill_p50"], 0, " tok/s"),
                delta(diff["prefill_p50"]),
            )
        )
    out.table([*columns, "Delta"], rows)
    out.line()
    verdict = record(c["verdict"])
    out.line(f"VERDICT: {s(verdict['outcome']).upper()}: {s(verdict['summary'])}")
    out.line(f"  evidence     {s(a.tx_dir)}")


def export(r: ExportResult, out: Out) -> None:
    red = r.redactions
    out.line(
        f"exported {len(r.artifacts)} artifacts to {s(r.out_dir)} "
        f"(redacted: {red.get('gpu_uuids', 0)} GPU UUIDs, {red.get('paths', 0)} host paths, "
        f"{red.get('secrets', 0)} secrets); manifest sha256 {s(r.manifest.sha256)}"
        + (" (recorded in the state database)" if r.recorded else "")
    )


def verify(r: VerifyResult, out: Out) -> None:
    if r.ok:
        out.line(f"ok: {r.checked} artifacts match {s(r.directory)}/manifest.json")
    else:
        out.line(f"MISMATCH: {s(r.directory)} does not verify ({len(r.mismatches)} problems)")
        for m in r.mismatches:
            if m.expected is not None:
                detail = f" (expected {s(m.expected)}, found {s(m.actual)})"
            else:
                detail = f": {s(m.actual)}" if m.actual is not None else ""
            out.line(f"  {s(m.path)}: {s(m.problem)}{detail}")
    if r.manifest_sha256:
        out.line(f"  manifest sha256 {s(r.manifest_sha256)}")
    for b in r.bindings or ():
        note = f" ({s(b.note)})" if b.note else ""
        out.line(f"  manifest {_BINDING_VERDICTS[b.matched]} {s(b.against)}{note}")


def report(r: ReportResult, out: Out) -> None:
    out.line(f"wrote {r.path} ({r.size:,} bytes), one self-contained page, from verified evidence:")
    for b in r.bundles:
        out.line(f"  {b['tx_id']}  manifest sha256 {b['manifest_sha256']}")


def claims(c: ClaimsCheck, out: Out) -> None:
    for m in c.bundle.mismatches:
        out.line(f"BUNDLE MISMATCH  {m.path}: {m.problem}")
    for r in c.claims:
        if r.status == "external-prior":
            out.line(
                f"external-prior   {r.claim}  (published by its source; not measured here, not recounted)"
            )
            continue
        label = {"ok": "ok", "differs": "DIFFERS", "missing": "MISSING"}[r.status]
        shown = ", ".join(f"{e['recounted']} from {e['artifact']}" for e in r.recounted)
        out.line(f"{label:<16} {r.claim}" + (f"  (= {shown})" if r.status == "ok" else ""))
        for problem in r.problems:
            out.line(f"                   {problem}")
    bad = [r.claim for r in c.claims if r.status in ("differs", "missing")]
    if c.ok:
        out.line(f"ok: every local claim of {c.ledger} matches {c.evidence}")
    else:
        named = "; ".join(bad) or "the bundle does not match its manifest"
        out.line(f"DRIFT: {len(bad)} claim(s) do not match the evidence: {named}")


_BINDING_VERDICTS: dict[object, str] = {True: "matches", False: "DIFFERS from", None: "not checked against"}
"""A manifest binding's `matched`, in words."""


def evidence_audit(view: views.EvidenceAudit, out: Out) -> None:
    data = view.data
    out.line(f"evidence of transaction {s(data['tx_id'])}")
    for g in records(data["gates"]):
        verdict = "PASS" if g["passed"] else "FAIL"
        out.line(
            f"  {s(g['gate']):<24} {verdict}  {s(g['kind']):<10} "
            f"{s(g['classification']):<24} {s(g['sha256'])}"
        )
    v = record(data["verify"])
    out.line(
        f"manifest: {'ok' if v['ok'] else 'MISMATCH'} ({v['checked']} artifacts)"
        + "".join(f"\n  {s(m['path'])}: {s(m['problem'])}" for m in records(v["mismatches"]))
    )
    for b in records(v.get("bindings")):
        verdict = _BINDING_VERDICTS[b["matched"]]
        out.line(f"  manifest {verdict} {b['against']}" + (f" ({b['note']})" if b["note"] else ""))


def gpu_readings(view: views.GpuReadings, out: Out) -> None:
    keep = ("index", "role", "uuid", "total_mib", "used_mib", "free_mib")
    rows = []
    for g in records(view.data["gpus"]):
        owner = record(g["owner"])
        who = f"{str(owner['container_id'])[:12]} ({owner['mode']})" if owner else ""
        rows.append({k: g[k] for k in keep} | {"owner": who, "processes": len(items(g["processes"]))})
    out.table(list(rows[0]) if rows else [], [list(r.values()) for r in rows])


def detected_roles(view: views.DetectedRoles, out: Out) -> None:
    data = view.data
    if data["written"]:
        state = f"written to {data['config']}"
    elif not data["changed"]:
        state = f"{data['config']} already has these roles"
    else:
        state = f"not written to {data['config']} (pass --write)"
    # TOML is the useful human form: it can be pasted into the host config.
    out.line(escape_text(str(data["toml"]), keep_newlines=True) + f"# {s(state)}")
