"""Human and JSON rendering of command results, chosen by the result's type.

`RENDERERS` maps a result type's fully qualified name to its human renderer. Names,
not classes, so that rendering a `status` does not import the qualify package: a
result can only exist once its module is loaded, and the lookup walks the type's
MRO. `tests/unit/test_cli_render.py` checks that every name resolves to a class.
`--json` prints `payload(result)`: a view's payload, a result's `as_dict()` or a
dataclass's fields, as exactly one JSON document.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table as RichTable

from anvil_ctl.cli import views

if TYPE_CHECKING:
    from anvil_ctl.commands.qualify import AbOutcome, QualifyOutcome
    from anvil_ctl.commands.recheck import RecheckResult
    from anvil_ctl.commands.recipes import Plan, RecipeView, ValidationReport
    from anvil_ctl.commands.report import ReportResult
    from anvil_ctl.engine.recover import RecoverReport
    from anvil_ctl.engine.runner import Outcome
    from anvil_ctl.qualify.claims import ClaimsCheck
    from anvil_ctl.qualify.evidence import ExportResult, VerifyResult

Renderer = Callable[[Any, Console], None]


def payload(result: Any) -> Any:
    """What `--json` prints for a result."""
    if isinstance(result, views.View):
        return result.payload()
    as_dict = getattr(result, "as_dict", None)
    if callable(as_dict):
        return as_dict()
    if is_dataclass(result) and not isinstance(result, type):
        return asdict(result)
    return result


def _json_default(o: Any) -> Any:
    converted = payload(o)
    return str(o) if converted is o else converted


def to_json(result: Any) -> str:
    return json.dumps(payload(result), indent=2, sort_keys=True, default=_json_default)


def console() -> Console:
    # Piped output (logs, cron mail) gets full-width tables instead of 80-column truncation.
    return Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def show(result: Any, as_json: bool) -> None:
    """Print a command's result: JSON, or the human renderer of its type."""
    if result is None:
        return
    if as_json:
        print(to_json(result))
        return
    out = console()
    renderer_for(type(result))(result, out)


def renderer_for(kind: type) -> Renderer:
    for klass in kind.__mro__:
        found = RENDERERS.get(f"{klass.__module__}.{klass.__qualname__}")
        if found is not None:
            return found
    return _as_json


# -- generic -----------------------------------------------------------------------------------


def _as_json(result: Any, out: Console) -> None:
    out.print(json.dumps(payload(result), indent=2, sort_keys=True, default=_json_default))


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return "" if value is None else str(value)


def _table(t: views.Table, out: Console) -> None:
    rows = t.human_rows()
    if not rows:
        out.print("(none)")
        return
    cols = list(t.columns or rows[0].keys())
    table = RichTable(*cols)
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in cols])
    out.print(table)


def _text(t: views.Text, out: Console) -> None:
    print(t.text, end="" if t.text.endswith("\n") else "\n")


# -- transactions ------------------------------------------------------------------------------


def _outcome(o: Outcome, out: Console) -> None:
    head = f"{o.kind}: {o.state.value}"
    if o.tx_id:
        head += f"  (transaction {o.tx_id})"
    if o.dry_run:
        head = f"{o.kind}: dry run, nothing changed" + (
            f"; would be REFUSED: {o.reason}" if o.state.value == "refused" else ""
        )
    out.print(head)
    if o.reason and not o.dry_run:
        out.print(f"  reason: {o.reason}")
    if o.dry_run:
        out.print("  plan:")
        for s in o.plan:
            out.print(f"    - {s['step']}: {s['description']} (undo: {s['undo']})")
        if o.before is not None:
            out.print(f"  starting snapshot sha256: {o.before.sha256}")
    if o.changes:
        out.print(f"  snapshot changes: {len(o.changes)}")
        for c in o.changes[:40]:
            out.print(f"    {c.path}: {c.before!r} -> {c.after!r}")


def _recover(r: RecoverReport, out: Console) -> None:
    if not (r.recovered or r.skipped or r.released_locks):
        out.print("recover: nothing to recover")
        return
    for rec in r.recovered:
        reason = f": {rec['reason']}" if rec.get("reason") else ""
        out.print(f"recovered {rec['tx_id']} ({rec.get('kind', '?')}) -> {rec['state']}{reason}")
    for skip in r.skipped:
        out.print(f"skipped {skip['tx_id']} ({skip.get('kind', '?')}): {skip.get('why', '')}")
    for lock in r.released_locks:
        out.print(f"released the dead owner's lock row {lock.get('id', '?')}")


def _recheck(r: RecheckResult, out: Console) -> None:
    table = RichTable("assertion", "result", "observed")
    for a in r.assertions:
        table.add_row(a["name"], "PASS" if a["passed"] else "FAIL", _cell(a["observed"]))
    out.print(table)
    verdict = "all assertions hold" if r.passed else "DRIFT: " + ", ".join(r.failed)
    out.print(f"recheck of slot {r.slot}: {verdict} (recorded as recheck {r.recheck_id})")


def _status(view: views.StatusView, out: Console) -> None:
    for name, slot in view.data["slots"].items():
        models = ", ".join(f"{m} ({n} tokens)" if n else m for m, n in slot["serving"]["models"]) or "nothing"
        out.print(
            f"slot {name}: {slot['binding']} serves {models} "
            f"({'healthy' if slot['serving']['healthy'] else 'NOT healthy'}); "
            f"tier {slot['router_tier']} for {', '.join(slot['aliases'])}"
        )
        inc = slot.get("incumbent")
        if inc:
            out.print(
                f"  incumbent: {inc['container_id'][:12]} {inc['served_model']} "
                f"[{inc['status']}] identity {inc['identity_digest'][:12]}"
            )
        else:
            out.print("  incumbent: none recorded (adopt the serving container first)")
        table = RichTable("container", "name", "role", "status", "image")
        for c in slot["containers"]:
            table.add_row(
                c["container_id"][:12], c["name"], c.get("role") or "", c["status"], c["image_id"][:19]
            )
        if slot["containers"]:
            out.print(table)
        backends = (slot.get("router") or {}).get("backends")
        if backends is not None:
            routed = (
                ", ".join(f"{b.get('url')} -> {b.get('observed_model')}" for b in backends) or "no backend"
            )
            out.print(f"  router: {routed}")


def _diffs(view: views.DiffView, out: Console) -> None:
    if not view.rows:
        out.print("(none)")
    for d in view.rows:
        verdict = "equal" if d["equal"] else f"{len(d['changes'])} change(s)"
        out.print(f"{d['label']}: {verdict} ({d['before_sha256'][:12]} -> {d['after_sha256'][:12]})")
        for c in d["changes"]:
            out.print(f"    {c['path']}: {c['before']!r} -> {c['after']!r}")


def _chain(view: views.ChainCheck, out: Console) -> None:
    if view.ok:
        out.print(f"audit journal: {view.data['rows']} rows, hash chain intact")
        return
    problems = view.data["problems"]
    out.print(f"audit journal: DRIFT, {len(problems)} problem(s) in {view.data['rows']} rows")
    for p in problems:
        out.print(f"  {json.dumps(p, sort_keys=True, default=str)}")


# -- recipes -----------------------------------------------------------------------------------


def _recipe_view(r: RecipeView, out: Console) -> None:
    out.print(f"recipe {r.name} ({r.path})")
    out.print(f"  digest    {r.digest}")
    out.print(f"  runnable  {'yes' if r.runnable else 'no'}")
    out.print(json.dumps(r.recipe, indent=2, sort_keys=True, default=str))


def _validation(r: ValidationReport, out: Console) -> None:
    out.print(f"ok: recipe {r.name} ({r.path}) is valid; digest {r.digest}")
    out.print(f"  runnable  {'yes' if r.runnable else 'no'}")
    if r.checked_slot:
        out.print(f"  fits slot {r.checked_slot}")
    if r.unknown:
        out.print(f"  unknown   {', '.join(r.unknown)}")
    if r.assumed:
        out.print(f"  assumed   {', '.join(r.assumed)}")


def _recipe_plan(p: Plan, out: Console) -> None:
    out.print(f"plan of recipe {p.recipe} for slot {p.slot} ({p.path}); nothing was touched")
    out.print(f"  digest              {p.digest}")
    out.print(f"  config fingerprint  {p.config_fingerprint}")
    out.print(f"  runnable            {'yes' if p.runnable else 'no'}")
    if p.unknown:
        out.print(f"  unknown             {', '.join(p.unknown)}")
    out.print(json.dumps(p.spec, indent=2, sort_keys=True, default=str))


# -- qualification and evidence ----------------------------------------------------------------


def _qualify(q: QualifyOutcome, out: Console) -> None:
    result, decision = q.result, q.decision
    if result is None or decision is None:  # refused, or the candidate changed: no decision
        _outcome(q.outcome, out)
        return
    from anvil_ctl.qualify import render_gates, render_summary, summary_table

    print(f"qualify: profile {result.profile}, {result.served_model} at {result.base_url}")
    print()
    if result.summary:
        if out.is_terminal:
            out.print(summary_table(result.summary, title="Capacity and endurance"))
        else:
            print(render_summary(result.summary))
        print()
    print(render_gates(result.gates))
    print()
    print(f"DECISION: {decision['outcome'].upper()}  (standing policy)")
    print(f"  decision     {decision['id']}  transaction {q.outcome.tx_id}")
    print(f"  identity     {decision['identity_digest']}  container {decision['container_id'][:12]}")
    for reason in decision["reasons"]:
        print(f"  reason       {reason}")
    if q.reclassified:
        rec = q.reclassified
        print(
            f"RECLASSIFIED: {rec['outcome'].upper()} under waiver(s) "
            f"{', '.join(rec['waiver_ids']) or '-'}  (decision {rec['id']} "
            f"reclassifies {decision['id']})"
        )
    print(f"  evidence     {result.tx_dir}  manifest sha256 {result.manifest.sha256}")


def _ab(a: AbOutcome, out: Console) -> None:
    if a.comparison is None:
        _outcome(a.outcome, out)
        return
    c = a.comparison
    names = c["arms"]
    print(f"A/B control (transaction {a.outcome.tx_id}): A = {names['A']}, B = {names['B']}")
    print(f"  declared before the first request: digest {c.get('declaration_digest')}")
    print()
    rows = [
        (
            "Nominal context",
            "A decode p50",
            "B decode p50",
            "Delta",
            "A prefill p50",
            "B prefill p50",
            "Delta",
        )
    ]

    def num(value: float | None, digits: int, unit: str) -> str:
        return "-" if value is None else f"{value:,.{digits}f}{unit}"

    def delta(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1f}%"

    for cell in c["cells"]:
        if cell.get("skipped"):
            rows.append((cell["label"], "skipped", "", "", "", "", ""))
            continue
        rows.append(
            (
                cell["label"],
                num(cell["A"]["decode_p50"], 2, " tok/s"),
                num(cell["B"]["decode_p50"], 2, " tok/s"),
                delta(cell["delta_pct"]["decode_p50"]),
                num(cell["A"]["prefill_p50"], 0, " tok/s"),
                num(cell["B"]["prefill_p50"], 0, " tok/s"),
                delta(cell["delta_pct"]["prefill_p50"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())
    print()
    verdict = c["verdict"]
    print(f"VERDICT: {verdict['outcome'].upper()}: {verdict['summary']}")
    print(f"  evidence     {a.tx_dir}")


def _export(r: ExportResult, out: Console) -> None:
    red = r.redactions
    print(
        f"exported {len(r.artifacts)} artifacts to {r.out_dir} "
        f"(redacted: {red.get('gpu_uuids', 0)} GPU UUIDs, {red.get('paths', 0)} host paths, "
        f"{red.get('secrets', 0)} secrets); manifest sha256 {r.manifest.sha256}"
    )


def _verify(r: VerifyResult, out: Console) -> None:
    if r.ok:
        print(f"ok: {r.checked} artifacts match {r.directory}/manifest.json")
        return
    print(f"MISMATCH: {r.directory} does not match its manifest ({len(r.mismatches)} problems)")
    for m in r.mismatches:
        detail = f" (expected {m.expected}, found {m.actual})" if m.expected else ""
        print(f"  {m.path}: {m.problem}{detail}")


def _report(r: ReportResult, out: Console) -> None:
    print(f"wrote {r.path} ({r.size:,} bytes), one self-contained page, from verified evidence:")
    for b in r.bundles:
        print(f"  {b['tx_id']}  manifest sha256 {b['manifest_sha256']}")


def _claims(c: ClaimsCheck, out: Console) -> None:
    for m in c.bundle.mismatches:
        print(f"BUNDLE MISMATCH  {m.path}: {m.problem}")
    for r in c.results:
        if r.status == "external-prior":
            print(f"external-prior   {r.claim}  (published by its source; not measured here, not recounted)")
            continue
        label = {"ok": "ok", "differs": "DIFFERS", "missing": "MISSING"}[r.status]
        shown = ", ".join(f"{e['recounted']} from {e['artifact']}" for e in r.recounted)
        print(f"{label:<16} {r.claim}" + (f"  (= {shown})" if r.status == "ok" else ""))
        for problem in r.problems:
            print(f"                   {problem}")
    bad = [r.claim for r in c.results if r.status in ("differs", "missing")]
    if c.ok:
        print(f"ok: every local claim of {c.ledger} matches {c.evidence}")
    else:
        named = "; ".join(bad) or "the bundle does not match its manifest"
        print(f"DRIFT: {len(bad)} claim(s) do not match the evidence: {named}")


def _evidence_audit(view: views.EvidenceAudit, out: Console) -> None:
    data = view.data
    print(f"evidence of transaction {data['tx_id']}")
    for g in data["gates"]:
        verdict = "PASS" if g["passed"] else "FAIL"
        print(f"  {g['gate']:<24} {verdict}  {g['kind']:<10} {g['classification']:<24} {g['sha256']}")
    v = data["verify"]
    print(
        f"manifest: {'ok' if v['ok'] else 'MISMATCH'} ({v['checked']} artifacts)"
        + "".join(f"\n  {m['path']}: {m['problem']}" for m in v["mismatches"])
    )


# -- GPUs --------------------------------------------------------------------------------------


def _gpu_readings(view: views.GpuReadings, out: Console) -> None:
    keep = ("index", "role", "uuid", "total_mib", "used_mib", "free_mib")
    rows = []
    for g in view.data["gpus"]:
        owner = g["owner"]
        who = f"{owner['container_id'][:12]} ({owner['mode']})" if owner else ""
        rows.append({k: g[k] for k in keep} | {"owner": who, "processes": len(g["processes"])})
    _table(views.Table(rows), out)


def _detected_roles(view: views.DetectedRoles, out: Console) -> None:
    data = view.data
    if data["written"]:
        state = f"written to {data['config']}"
    elif not data["changed"]:
        state = f"{data['config']} already has these roles"
    else:
        state = f"not written to {data['config']} (pass --write)"
    # TOML is the useful human form: it can be pasted into the host config.
    print(data["toml"] + f"# {state}")


RENDERERS: dict[str, Renderer] = {
    "anvil_ctl.cli.views.Table": _table,
    "anvil_ctl.cli.views.Record": _as_json,
    "anvil_ctl.cli.views.Text": _text,
    "anvil_ctl.cli.views.StatusView": _status,
    "anvil_ctl.cli.views.DiffView": _diffs,
    "anvil_ctl.cli.views.ChainCheck": _chain,
    "anvil_ctl.cli.views.GpuReadings": _gpu_readings,
    "anvil_ctl.cli.views.DetectedRoles": _detected_roles,
    "anvil_ctl.cli.views.EvidenceAudit": _evidence_audit,
    "anvil_ctl.engine.runner.Outcome": _outcome,
    "anvil_ctl.engine.recover.RecoverReport": _recover,
    "anvil_ctl.commands.recheck.RecheckResult": _recheck,
    "anvil_ctl.commands.qualify.QualifyOutcome": _qualify,
    "anvil_ctl.commands.qualify.AbOutcome": _ab,
    "anvil_ctl.commands.recipes.RecipeView": _recipe_view,
    "anvil_ctl.commands.recipes.ValidationReport": _validation,
    "anvil_ctl.commands.recipes.Plan": _recipe_plan,
    "anvil_ctl.qualify.evidence.ExportResult": _export,
    "anvil_ctl.qualify.claims.ClaimsCheck": _claims,
    "anvil_ctl.commands.report.ReportResult": _report,
    "anvil_ctl.qualify.evidence.VerifyResult": _verify,
}
"""Human renderer by result type (fully qualified name); anything else prints as JSON."""
