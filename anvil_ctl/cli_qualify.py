"""Subcommands: qualify, evidence export|verify, audit decisions|evidence.

`qualify` exits 0 whenever it ran and recorded a decision, whatever the decision
says (verified, policy-infeasible or failed are data, printed prominently and
stored); 3 when refused before running (no candidate, or the slot serves
something else); 4 when the candidate changed during the run (no decision).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from anvil_ctl.commands import qualify as qualify_cmd
from anvil_ctl.qualify import make_progress, render_gates, render_summary, summary_table

EXIT_EVIDENCE_MISMATCH = 6

QUALIFY_HELP = """\
Run the qualification profile against the slot's current candidate (the latest loaded
one, which must be what the slot serves), write the evidence under
<state>/evidence/<transaction>/ and record a decision bound to the candidate's identity.

The decision is computed under the standing policy; if an active waiver changes it, a
second decision that reclassifies the first is recorded too (the first is never changed).

Exit status: 0 when the qualification ran and a decision was recorded, whatever the
decision (verified, policy-infeasible or failed: read it in the output or with --json);
3 refused before running (no candidate, or the slot serves something else);
4 the candidate changed during the run (evidence kept, no decision recorded).
"""


def _print_qualify(out: qualify_cmd.QualifyOutcome) -> None:
    result, decision = out.result, out.decision
    assert result is not None and decision is not None
    console = Console(highlight=False, soft_wrap=True)
    print(f"qualify: profile {result.profile}, {result.served_model} at {result.base_url}")
    print()
    if result.summary:
        if console.is_terminal:
            console.print(summary_table(result.summary, title="Capacity and endurance"))
        else:
            print(render_summary(result.summary))
        print()
    print(render_gates(result.gates))
    print()
    print(f"DECISION: {decision['outcome'].upper()}  (standing policy)")
    print(f"  decision     {decision['id']}  transaction {out.outcome.tx_id}")
    print(f"  identity     {decision['identity_digest']}  container {decision['container_id'][:12]}")
    for reason in decision["reasons"]:
        print(f"  reason       {reason}")
    if out.reclassified:
        rec = out.reclassified
        print(
            f"RECLASSIFIED: {rec['outcome'].upper()} under waiver(s) "
            f"{', '.join(rec['waiver_ids']) or '-'}  (decision {rec['id']} "
            f"reclassifies {decision['id']})"
        )
    print(f"  evidence     {result.tx_dir}  manifest sha256 {result.manifest.sha256}")


def _qualify(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    gates = [g.strip() for g in (a.gates or "").split(",") if g.strip()]
    out = qualify_cmd.qualify_slot(
        ctx, slot=a.slot, profile=a.profile, gates=gates, progress=make_progress(sys.stderr)
    )
    if out.result is None or out.decision is None:
        return (out.as_dict() if a.json else out.outcome), out.exit_code
    if a.json:
        return out.as_dict(), out.exit_code
    _print_qualify(out)
    return None, out.exit_code


def _export(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = qualify_cmd.export_evidence(ctx, a.tx, a.dir)
    if a.json:
        return result, 0
    r = result.redactions
    print(
        f"exported {len(result.artifacts)} artifacts to {result.out_dir} "
        f"(redacted: {r.get('gpu_uuids', 0)} GPU UUIDs, {r.get('paths', 0)} host paths, "
        f"{r.get('secrets', 0)} secrets); manifest sha256 {result.manifest.sha256}"
    )
    return None, 0


def _verify(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = qualify_cmd.verify_evidence(a.dir)
    code = 0 if result.ok else EXIT_EVIDENCE_MISMATCH
    if a.json:
        return result, code
    if result.ok:
        print(f"ok: {result.checked} artifacts match {a.dir}/manifest.json")
    else:
        print(f"MISMATCH: {a.dir} does not match its manifest ({len(result.mismatches)} problems)")
        for m in result.mismatches:
            detail = f" (expected {m.expected}, found {m.actual})" if m.expected else ""
            print(f"  {m.path}: {m.problem}{detail}")
    return None, code


def _audit_decisions(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    rows = qualify_cmd.audit_decisions(ctx, slot=a.slot)
    if a.json:
        return rows, 0
    return [
        {
            "decision": r["id"][:16],
            "at": r["at"][:19],
            "outcome": r["outcome"],
            "reclassifies": (r["reclassifies"] or "")[:16],
            "waivers": ",".join(r["waiver_ids"]),
            "profile": r["profile"],
            "identity": r["identity_digest"][:12],
        }
        for r in rows
    ], 0


def _audit_evidence(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    data = qualify_cmd.audit_evidence(ctx, a.tx)
    code = 0 if data["verify"]["ok"] else EXIT_EVIDENCE_MISMATCH
    if a.json:
        return data, code
    print(f"evidence of transaction {data['tx_id']}")
    for g in data["gates"]:
        verdict = "PASS" if g["passed"] else "FAIL"
        print(f"  {g['gate']:<24} {verdict}  {g['kind']:<10} {g['classification']:<24} {g['sha256']}")
    v = data["verify"]
    print(
        f"manifest: {'ok' if v['ok'] else 'MISMATCH'} ({v['checked']} artifacts)"
        + "".join(f"\n  {m['path']}: {m['problem']}" for m in v["mismatches"])
    )
    return None, code


def _audit_subparsers(sub: Any) -> Any:
    """The `audit` command's subparsers (created in cli_commands), to add listings to."""
    audit = sub.choices.get("audit")
    if audit is None:
        return None
    return next(
        (x for x in audit._actions if isinstance(x, argparse._SubParsersAction)),
        None,
    )


def register(sub: Any) -> None:
    q = sub.add_parser(
        "qualify",
        help="qualify the slot's candidate; record evidence and a decision (exit 0 = decided)",
        description=QUALIFY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("--slot", required=True)
    q.add_argument("--profile", help="profile name or TOML path (default: the recipe's profile)")
    q.add_argument("--gates", help="only these gates of the profile, comma-separated")
    q.set_defaults(handler=_qualify)

    ev = sub.add_parser("evidence", help="qualification evidence bundles").add_subparsers(
        dest="evidence_cmd", required=True
    )
    ex = ev.add_parser(
        "export",
        help="write a shareable copy of a transaction's evidence "
        "(GPU UUIDs, host paths and router tokens redacted)",
    )
    ex.add_argument("tx", help="transaction ID (or a unique prefix)")
    ex.add_argument("dir", type=Path, help="new or empty directory")
    ex.set_defaults(handler=_export)
    vf = ev.add_parser("verify", help="check a bundle against its manifest (exit 6 on mismatch)")
    vf.add_argument("dir", type=Path)
    vf.set_defaults(handler=_verify)

    au = _audit_subparsers(sub)
    if au is None:  # no `audit` command: register the listings at top level
        au = sub.add_parser("decisions-audit", help="qualification records").add_subparsers(
            dest="qaudit_cmd", required=True
        )
    if "decisions" not in au.choices:  # cli_commands may list them already
        d = au.add_parser("decisions", help="qualification decisions, reclassifications included")
        d.add_argument("--slot")
        d.set_defaults(handler=_audit_decisions)
    if "evidence" not in au.choices:
        e = au.add_parser("evidence", help="one transaction's gate rows and its manifest check")
        e.add_argument("tx")
        e.set_defaults(handler=_audit_evidence)
