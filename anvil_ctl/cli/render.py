"""Human and JSON rendering of command results, chosen by the result's type.

`RENDERERS` maps a result type's fully qualified name to its human renderer. Names,
not classes, so that rendering a `status` does not import the qualify package: a
result can only exist once its module is loaded, and the lookup walks the type's
MRO. `tests/unit/test_cli_render.py` checks that every name resolves to a class.
`--json` prints `payload(result)`: a view's payload, a result's `as_dict()` or a
dataclass's fields, as exactly one JSON document.

Warning: every value shown to a person may have come from a person or a file (an
approver, a reason, a container name, a manifest path). Human renderers pass each
one through `_s` (control, bidi and invisible characters and newlines shown as
escapes), so no record can clear the screen or print a line of its own; JSON is
escaped by the encoder (`ensure_ascii`).
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
from anvil_ctl.core.validate import escape_text

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
    return Console(
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=True,
        width=None if sys.stdout.isatty() else 200,
    )


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


def _s(value: Any) -> str:
    """A value as one safe line of text (see the module warning)."""
    return escape_text("" if value is None else str(value))


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)  # ensure_ascii: escaped by the encoder
    return _s(value)


def _table(t: views.Table, out: Console) -> None:
    rows = t.human_rows()
    if not rows:
        out.print("(none)")
        return
    cols = list(t.columns or rows[0].keys())
    table = RichTable(*[_s(c) for c in cols])
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in cols])
    out.print(table)


def _text(t: views.Text, out: Console) -> None:
    text = escape_text(t.text, keep_newlines=True)
    print(text, end="" if text.endswith("\n") else "\n")


# -- transactions ------------------------------------------------------------------------------


def _outcome(o: Outcome, out: Console) -> None:
    head = f"{o.kind}: {o.state.value}"
    if o.tx_id:
        head += f"  (transaction {o.tx_id})"
    if o.dry_run:
        head = f"{o.kind}: dry run, nothing changed" + (
            f"; would be REFUSED: {_s(o.reason)}" if o.state.value == "refused" else ""
        )
    out.print(head)
    if o.reason and not o.dry_run:
        out.print(f"  reason: {_s(o.reason)}")
    if o.dry_run:
        out.print("  plan:")
        for s in o.plan:
            out.print(f"    - {_s(s['step'])}: {_s(s['description'])} (undo: {_s(s['undo'])})")
        if o.before is not None:
            out.print(f"  starting snapshot sha256: {o.before.sha256}")
    if o.changes:
        out.print(f"  snapshot changes: {len(o.changes)}")
        for c in o.changes[:40]:
            out.print(f"    {_s(c.path)}: {_s(repr(c.before))} -> {_s(repr(c.after))}")


def _recover(r: RecoverReport, out: Console) -> None:
    if not (r.recovered or r.skipped or r.released_locks):
        out.print("recover: nothing to recover")
        return
    for rec in r.recovered:
        reason = f": {_s(rec['reason'])}" if rec.get("reason") else ""
        out.print(f"recovered {_s(rec['tx_id'])} ({_s(rec.get('kind', '?'))}) -> {_s(rec['state'])}{reason}")
    for skip in r.skipped:
        what = skip.get("tx_id") or f"lock {skip.get('lock_id', '?')}"
        out.print(f"skipped {_s(what)} ({_s(skip.get('kind', '?'))}): {_s(skip.get('why', ''))}")
    for lock in r.released_locks:
        out.print(f"released the dead owner's lock row {_s(lock.get('id', '?'))}")


def _recheck(r: RecheckResult, out: Console) -> None:
    table = RichTable("assertion", "result", "observed")
    for a in r.assertions:
        table.add_row(_s(a["name"]), "PASS" if a["passed"] else "FAIL", _cell(a["observed"]))
    out.print(table)
    if not r.up:
        verdict = f"UNAVAILABLE, could not observe: {_s(r.unavailable)}"
    elif r.passed:
        verdict = "all assertions hold"
    else:
        verdict = "DRIFT: " + ", ".join(_s(f) for f in r.failed)
    recorded = f"recorded as recheck {r.recheck_id}" if r.recheck_id is not None else "NOT recorded"
    out.print(f"recheck of slot {_s(r.slot)}: {verdict} ({recorded})")
    if r.audit_head:
        out.print(f"audit head {_s(r.audit_head)}")


def _status(view: views.StatusView, out: Console) -> None:
    for name, slot in view.data["slots"].items():
        models = (
            ", ".join(f"{_s(m)} ({n} tokens)" if n else _s(m) for m, n in slot["serving"]["models"])
            or "nothing"
        )
        out.print(
            f"slot {_s(name)}: {_s(slot['binding'])} serves {models} "
            f"({'healthy' if slot['serving']['healthy'] else 'NOT healthy'}); "
            f"tier {_s(slot['router_tier'])} for {', '.join(_s(a) for a in slot['aliases'])}"
        )
        inc = slot.get("incumbent")
        if inc:
            out.print(
                f"  incumbent: {_s(inc['container_id'][:12])} {_s(inc['served_model'])} "
                f"[{_s(inc['status'])}] identity {_s(inc['identity_digest'][:12])}"
            )
        else:
            out.print("  incumbent: none recorded (adopt the serving container first)")
        table = RichTable("container", "name", "role", "status", "image")
        for c in slot["containers"]:
            table.add_row(
                *(
                    _s(v)
                    for v in (
                        c["container_id"][:12],
                        c["name"],
                        c.get("role"),
                        c["status"],
                        c["image_id"][:19],
                    )
                )
            )
        if slot["containers"]:
            out.print(table)
        backends = (slot.get("router") or {}).get("backends")
        if backends is not None:
            routed = (
                ", ".join(f"{_s(b.get('url'))} -> {_s(b.get('observed_model'))}" for b in backends)
                or "no backend"
            )
            out.print(f"  router: {routed}")


def _diffs(view: views.DiffView, out: Console) -> None:
    if not view.rows:
        out.print("(none)")
    for d in view.rows:
        verdict = "equal" if d["equal"] else f"{len(d['changes'])} change(s)"
        out.print(
            f"{_s(d['label'])}: {verdict} ({_s(d['before_sha256'][:12])} -> {_s(d['after_sha256'][:12])})"
        )
        for c in d["changes"]:
            out.print(f"    {_s(c['path'])}: {_s(repr(c['before']))} -> {_s(repr(c['after']))}")


def _chain(view: views.ChainCheck, out: Console) -> None:
    d = view.data
    how = d["mode"] if not d.get("escalated") else f"{d['mode']}, walked everything: {d['escalated']}"
    checked = f"{d['entries_checked']} entries and {d['rows_checked']} rows checked ({how})"
    if view.ok:
        out.print(f"audit journal: {d['entries']} entries, hash chain intact; {checked}")
    else:
        problems = d["problems"]
        out.print(f"audit journal: DRIFT, {len(problems)} problem(s); {checked}")
        for p in problems:
            out.print(f"  {json.dumps(p, sort_keys=True, default=str)}")
    out.print(f"  head       {d['head']}")
    head_file = d.get("head_file") or {}
    if head_file.get("path"):
        recorded = head_file.get("head") or "missing"
        out.print(f"  head file  {head_file['path']}: {recorded}")
    if d.get("checkpoint"):
        out.print(f"  checkpoint {d['checkpoint']['id']} recorded at {d['checkpoint']['head']}")
    elif d.get("checkpoint_error"):
        out.print(f"  checkpoint not recorded: {d['checkpoint_error']}")


# -- recipes -----------------------------------------------------------------------------------


def _recipe_view(r: RecipeView, out: Console) -> None:
    out.print(f"recipe {_s(r.name)} ({_s(r.path)})")
    out.print(f"  digest    {_s(r.digest)}")
    out.print(f"  runnable  {'yes' if r.runnable else 'no'}")
    out.print(json.dumps(r.recipe, indent=2, sort_keys=True, default=str))


def _validation(r: ValidationReport, out: Console) -> None:
    out.print(f"ok: recipe {_s(r.name)} ({_s(r.path)}) is valid; digest {_s(r.digest)}")
    out.print(f"  runnable  {'yes' if r.runnable else 'no'}")
    if r.checked_slot:
        out.print(f"  fits slot {_s(r.checked_slot)}")
    if r.unknown:
        out.print(f"  unknown   {', '.join(_s(u) for u in r.unknown)}")
    if r.assumed:
        out.print(f"  assumed   {', '.join(_s(a) for a in r.assumed)}")


def _recipe_plan(p: Plan, out: Console) -> None:
    out.print(f"plan of recipe {_s(p.recipe)} for slot {_s(p.slot)} ({_s(p.path)}); nothing was touched")
    out.print(f"  digest              {_s(p.digest)}")
    out.print(f"  config fingerprint  {_s(p.config_fingerprint)}")
    out.print(f"  runnable            {'yes' if p.runnable else 'no'}")
    if p.unknown:
        out.print(f"  unknown             {', '.join(_s(u) for u in p.unknown)}")
    out.print(json.dumps(p.spec, indent=2, sort_keys=True, default=str))


# -- qualification and evidence ----------------------------------------------------------------


def _qualify(q: QualifyOutcome, out: Console) -> None:
    result, decision = q.result, q.decision
    if result is None or decision is None:  # refused, or the candidate changed: no decision
        _outcome(q.outcome, out)
        return
    from anvil_ctl.qualify import render_gates, render_summary, summary_table

    print(f"qualify: profile {_s(result.profile)}, {_s(result.served_model)} at {_s(result.base_url)}")
    print()
    if result.summary:
        if out.is_terminal:
            out.print(summary_table(result.summary, title="Capacity and endurance"))
        else:
            print(escape_text(render_summary(result.summary), keep_newlines=True))
        print()
    print(escape_text(render_gates(result.gates), keep_newlines=True))
    print()
    print(f"DECISION: {_s(decision['outcome'].upper())}  (standing policy)")
    print(f"  decision     {_s(decision['id'])}  transaction {_s(q.outcome.tx_id)}")
    print(f"  identity     {_s(decision['identity_digest'])}  container {_s(decision['container_id'][:12])}")
    for reason in decision["reasons"]:
        print(f"  reason       {_s(reason)}")
    if q.reclassified:
        rec = q.reclassified
        print(
            f"RECLASSIFIED: {_s(rec['outcome'].upper())} under waiver(s) "
            f"{', '.join(_s(w) for w in rec['waiver_ids']) or '-'}  (decision {_s(rec['id'])} "
            f"reclassifies {_s(decision['id'])})"
        )
    print(f"  evidence     {_s(result.tx_dir)}  manifest sha256 {_s(result.manifest.sha256)}")


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
        f"exported {len(r.artifacts)} artifacts to {_s(r.out_dir)} "
        f"(redacted: {red.get('gpu_uuids', 0)} GPU UUIDs, {red.get('paths', 0)} host paths, "
        f"{red.get('secrets', 0)} secrets); manifest sha256 {_s(r.manifest.sha256)}"
        + (" (recorded in the state database)" if r.recorded else "")
    )


def _verify(r: VerifyResult, out: Console) -> None:
    if r.ok:
        print(f"ok: {r.checked} artifacts match {_s(r.directory)}/manifest.json")
    else:
        print(f"MISMATCH: {_s(r.directory)} does not verify ({len(r.mismatches)} problems)")
        for m in r.mismatches:
            if m.expected is not None:
                detail = f" (expected {_s(m.expected)}, found {_s(m.actual)})"
            else:
                detail = f": {_s(m.actual)}" if m.actual is not None else ""
            print(f"  {_s(m.path)}: {_s(m.problem)}{detail}")
    if r.manifest_sha256:
        print(f"  manifest sha256 {_s(r.manifest_sha256)}")
    for b in r.bindings or ():
        verdict = {True: "matches", False: "DIFFERS from", None: "not checked against"}[b.matched]
        note = f" ({_s(b.note)})" if b.note else ""
        print(f"  manifest {verdict} {_s(b.against)}{note}")


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
    print(f"evidence of transaction {_s(data['tx_id'])}")
    for g in data["gates"]:
        verdict = "PASS" if g["passed"] else "FAIL"
        print(
            f"  {_s(g['gate']):<24} {verdict}  {_s(g['kind']):<10} "
            f"{_s(g['classification']):<24} {_s(g['sha256'])}"
        )
    v = data["verify"]
    print(
        f"manifest: {'ok' if v['ok'] else 'MISMATCH'} ({v['checked']} artifacts)"
        + "".join(f"\n  {_s(m['path'])}: {_s(m['problem'])}" for m in v["mismatches"])
    )
    for b in v.get("bindings") or ():
        verdict = {True: "matches", False: "DIFFERS from", None: "not checked against"}[b["matched"]]
        print(f"  manifest {verdict} {b['against']}" + (f" ({b['note']})" if b["note"] else ""))


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
    print(escape_text(data["toml"], keep_newlines=True) + f"# {_s(state)}")


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
