"""Human rendering of command results: tables for lists of records, indented text otherwise."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped output (logs, cron mail) gets full-width tables instead of 80-column truncation.
console = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def show(payload: Any) -> None:
    if isinstance(payload, list):
        if not payload:
            console.print("(none)")
            return
        if all(isinstance(r, dict) and {"label", "equal", "changes"} <= r.keys() for r in payload):
            _diffs(payload)
            return
        if all(isinstance(r, dict) for r in payload):
            cols = list(payload[0].keys())
            table = Table(*cols)
            for row in payload:
                table.add_row(*[_cell(row.get(c)) for c in cols])
            console.print(table)
            return
    if isinstance(payload, dict) and "state" in payload and "kind" in payload and "plan" in payload:
        _outcome(payload)
        return
    if isinstance(payload, dict) and "assertions" in payload:
        _recheck(payload)
        return
    if isinstance(payload, dict) and "slots" in payload and "host" in payload:
        _status(payload)
        return
    console.print(json.dumps(payload, indent=2, sort_keys=True, default=str))


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return "" if value is None else str(value)


def _outcome(o: dict[str, Any]) -> None:
    head = f"{o['kind']}: {o['state']}"
    if o.get("tx_id"):
        head += f"  (transaction {o['tx_id']})"
    if o.get("dry_run"):
        head = f"{o['kind']}: dry run, nothing changed" + (
            f"; would be REFUSED: {o['reason']}" if o["state"] == "refused" else ""
        )
    console.print(head)
    if o.get("reason") and not o.get("dry_run"):
        console.print(f"  reason: {o['reason']}")
    if o.get("dry_run"):
        console.print("  plan:")
        for s in o["plan"]:
            console.print(f"    - {s['step']}: {s['description']} (undo: {s['undo']})")
        if o.get("before_sha256"):
            console.print(f"  starting snapshot sha256: {o['before_sha256']}")
    if o.get("changes"):
        console.print(f"  snapshot changes: {len(o['changes'])}")
        for c in o["changes"][:40]:
            console.print(f"    {c['path']}: {c['before']!r} -> {c['after']!r}")


def _recheck(r: dict[str, Any]) -> None:
    table = Table("assertion", "result", "observed")
    for a in r["assertions"]:
        table.add_row(a["name"], "PASS" if a["passed"] else "FAIL", _cell(a["observed"]))
    console.print(table)
    verdict = "all assertions hold" if r["passed"] else "DRIFT: " + ", ".join(r["failed"])
    console.print(f"recheck of slot {r['slot']}: {verdict} (recorded as recheck {r.get('recheck_id')})")


def _status(st: dict[str, Any]) -> None:
    for name, slot in st["slots"].items():
        models = ", ".join(f"{m} ({n} tokens)" if n else m for m, n in slot["serving"]["models"]) or "nothing"
        console.print(
            f"slot {name}: {slot['binding']} serves {models} "
            f"({'healthy' if slot['serving']['healthy'] else 'NOT healthy'}); "
            f"tier {slot['router_tier']} for {', '.join(slot['aliases'])}"
        )
        inc = slot.get("incumbent")
        if inc:
            console.print(
                f"  incumbent: {inc['container_id'][:12]} {inc['served_model']} "
                f"[{inc['status']}] identity {inc['identity_digest'][:12]}"
            )
        else:
            console.print("  incumbent: none recorded (adopt the serving container first)")
        table = Table("container", "name", "role", "status", "image")
        for c in slot["containers"]:
            table.add_row(
                c["container_id"][:12], c["name"], c.get("role") or "", c["status"], c["image_id"][:19]
            )
        if slot["containers"]:
            console.print(table)
        backends = (slot.get("router") or {}).get("backends")
        if backends is not None:
            routed = (
                ", ".join(f"{b.get('url')} -> {b.get('observed_model')}" for b in backends) or "no backend"
            )
            console.print(f"  router: {routed}")


def _diffs(diffs: list[dict[str, Any]]) -> None:
    for d in diffs:
        verdict = "equal" if d["equal"] else f"{len(d['changes'])} change(s)"
        console.print(f"{d['label']}: {verdict} ({d['before_sha256'][:12]} -> {d['after_sha256'][:12]})")
        for c in d["changes"]:
            console.print(f"    {c['path']}: {c['before']!r} -> {c['after']!r}")
