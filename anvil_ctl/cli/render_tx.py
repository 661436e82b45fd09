"""Human renderings of transactions (audit show's timeline) and their records: recover, recheck,
the audit chain (see `render`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from anvil_ctl.cli import views
from anvil_ctl.cli.output import Out, cell, s, show_time
from anvil_ctl.cli.views import record, records
from anvil_ctl.core.jsontypes import whole
from anvil_ctl.core.snapshot import show_value

if TYPE_CHECKING:
    from anvil_ctl.commands.recheck import RecheckResult
    from anvil_ctl.engine.outcome import Outcome
    from anvil_ctl.engine.recover import RecoverReport

MAX_CHANGES = 40
"""An outcome lists this many snapshot changes; `audit diff TX` lists them all."""


def change_line(c: Mapping[str, object]) -> str:
    """`+ path: value`, `- path: value` or `~ path: before -> after`; never None for absence."""
    path = s(c["path"])
    if c["op"] == "add":
        return f"+ {path}: {s(show_value(c['after']))}"
    if c["op"] == "remove":
        return f"- {path}: {s(show_value(c['before']))}"
    return f"~ {path}: {s(show_value(c['before']))} -> {s(show_value(c['after']))}"


def outcome(o: Outcome, out: Out) -> None:
    head = f"{o.kind}: {o.state.value}"
    if o.tx_id:
        head += f"  (transaction {o.tx_id})"
    if o.dry_run:
        head = f"{o.kind}: dry run, nothing changed" + (
            f"; would be REFUSED: {s(o.reason)}" if o.state.value == "refused" else ""
        )
    out.line(head)
    if o.reason and not o.dry_run:
        out.line(f"  reason: {s(o.reason)}")
    after = o.followed_by
    if after is not None:
        out.line(f"  then {after.kind}: {after.state.value}  (transaction {after.tx_id})")
        if after.reason:
            out.line(f"    reason: {s(after.reason)}")
    if o.dry_run:
        out.line("  plan:")
        for step in o.plan:
            out.line(f"    - {s(step['step'])}: {s(step['description'])} (undo: {s(step['undo'])})")
        if o.before is not None:
            out.line(f"  starting snapshot sha256: {o.before.sha256}")
    if o.changes:
        out.line(f"  snapshot changes: {len(o.changes)}")
        for c in o.changes[:MAX_CHANGES]:
            out.line(f"    {change_line(c.as_dict())}")
        if len(o.changes) > MAX_CHANGES:
            out.line(f"    ... {len(o.changes) - MAX_CHANGES} more: anvilctl audit diff {o.tx_id}")
    if o.then is not None:
        outcome(o.then, out)


def diffs(view: views.DiffView, out: Out) -> None:
    if not view.rows:
        out.line("(none)")
    for d in view.rows:
        changes = records(d["changes"])
        verdict = "equal" if d["equal"] else f"{len(changes)} change(s)"
        before, after = str(d["before_sha256"])[:12], str(d["after_sha256"])[:12]
        out.line(f"{s(d['label'])}: {verdict} ({s(before)} -> {s(after)})")
        for c in changes:
            out.line(f"  {change_line(c)}")


def _took(start: str, end: str) -> str:
    try:
        took = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    except (TypeError, ValueError):
        return ""
    return f"{took.total_seconds():.1f} s"


def _summary(detail: Mapping[str, object], limit: int = 100) -> str:
    """A step's detail in a few words: its scalar fields as key=value, IDs shortened."""
    parts = []
    for key, value in detail.items():
        if isinstance(value, dict | list) or value is None:
            continue
        text = str(value)
        if len(text) > 24 and key.endswith(("_id", "digest", "sha256")):
            text = text[:12]
        parts.append(f"{key}={text}")
    joined = " ".join(parts)
    return s(joined if len(joined) <= limit else joined[: limit - 1] + "…")


def _timeline(detail: Mapping[str, object]) -> list[tuple[str, str]]:
    """(time, line) for each state change and each step (its intent and outcome on one line)."""
    events: list[tuple[str, str]] = []
    for st in records(detail["states"]):
        reason = f": {s(st['reason'])}" if st.get("reason") else ""
        events.append((str(st["at"]), f"state {s(st['state'])}{reason}"))
    opened: dict[tuple[int, object, object], str] = {}
    for ev in records(detail["steps"]):
        seq, at = whole(ev["seq"]), str(ev["at"])
        key = (seq, ev["step"], ev["phase"])
        label = f"[{seq + 1}] {s(ev['step'])}" if seq >= 0 else s(ev["step"])
        if ev["phase"] == "undo":
            label = f"undo {label}"
        if ev["event"] == "intent":
            opened[key] = at
            continue
        since = opened.pop(key, None)
        took = f" in {_took(since, at)}" if since else ""
        info = record(ev.get("detail"))
        if ev["event"] == "error":
            message = info.get("message") or info.get("problems") or info
            text = f"{label}: FAILED{took}: {s(message)}"
        elif ev["event"] == "result":
            text = f"{label}: done{took}"
        else:
            text = f"{label}: {s(ev['event'])}"
        if ev["step"] == "watch" and ev["event"] == "sample":
            info = record(info.get("metrics"))  # a watch sample: what it measured
        more = _summary(info) if ev["event"] != "error" else ""
        events.append((since or at, text + (f"  ({more})" if more else "")))
    for key, since in opened.items():  # an intent without a result: the process died there
        events.append(
            (since, f"[{key[0] + 1}] {s(key[1])}: started, never finished (see `anvilctl recover`)")
        )
    return sorted(events, key=lambda e: e[0])


def transaction(view: views.TransactionView, out: Out) -> None:
    d = view.data
    states, snapshots = records(d["states"]), records(d["snapshots"])
    state = states[-1]["state"] if states else "?"
    slot = f" on slot {s(d['slot'])}" if d.get("slot") else ""
    out.line(f"transaction {s(d['tx_id'])}: {s(d['kind'])}{slot}, {s(state)}")
    owner = record(d.get("owner"))
    out.line(
        f"  created {show_time(s(d['created_at']))} by pid {s(owner.get('pid'))} on {s(owner.get('host'))}"
    )
    out.line("")
    for at, text in _timeline(d):
        out.line(f"  {show_time(s(at))}  {text}")
    if snapshots:
        out.line("")
        out.line(
            "  snapshots:  " + ", ".join(f"{s(x['label'])} {s(str(x['sha256'])[:12])}" for x in snapshots)
        )
    for ident in records(d["identities"]):
        out.line(
            f"  recorded {s(ident['role'])}: container {s(str(ident['container_id'])[:12])} "
            f"{s(ident['served_model'])} (identity {s(str(ident['digest'])[:12])})"
        )
    if snapshots:
        out.line(f"  what changed: anvilctl audit diff {s(str(d['tx_id'])[:8])}")
    _links(d, states, out)


def _links(d: Mapping[str, object], states: list[Mapping[str, object]], out: Out) -> None:
    """Who decided a rollback no person asked for, and the transactions it is linked to."""
    decided = record(record(d.get("args")).get("decided_by"))
    if decided:
        who = decided.get("enabled_by") or decided.get("by") or decided.get("profile")
        out.line(f"  decided by: {s(decided.get('policy'))} ({s(who)})")
        if decided.get("why"):
            out.line(f"    {s(decided.get('why'))}")
        for b in records(decided.get("breaches")):
            out.line(
                f"    breach: {s(b.get('metric'))} {s(b.get('observed'))} against {s(b.get('op'))} "
                f"{s(b.get('limit'))} ({s(b.get('source'))})"
            )
        for sample in records(decided.get("breaching_samples")):
            asked = records(sample.get("requests"))
            failed = sum(1 for r in asked if not r.get("ok"))
            measured = record(sample.get("metrics"))
            values = " ".join(f"{k}={s(v)}" for k, v in sorted(measured.items()) if v is not None)
            out.line(f"    sample {s(sample.get('n'))}: {failed} of {len(asked)} requests failed; {values}")
        undoes = record(decided.get("undoes"))
        if undoes:
            out.line(f"  undoes: {s(undoes.get('kind'))} {s(undoes.get('tx_id'))}")
    follow = record(record(states[-1].get("data")).get("followed_by")) if states else {}
    if follow:
        out.line(f"  followed by: {s(follow.get('kind'))} {s(follow.get('tx_id'))}")


def recover(r: RecoverReport, out: Out) -> None:
    if not (r.recovered or r.skipped or r.released_locks):
        out.line("recover: nothing to recover")
        return
    for rec in r.recovered:
        reason = f": {s(rec['reason'])}" if rec.get("reason") else ""
        out.line(f"recovered {s(rec['tx_id'])} ({s(rec.get('kind', '?'))}) -> {s(rec['state'])}{reason}")
        if rec.get("dark"):
            out.line("  the slot serves nothing: bring a serve back by hand (`anvilctl rollback --to`)")
    for skip in r.skipped:
        what = skip.get("tx_id") or f"lock {skip.get('lock_id', '?')}"
        out.line(f"skipped {s(what)} ({s(skip.get('kind', '?'))}): {s(skip.get('why', ''))}")
    for lock in r.released_locks:
        out.line(f"released the dead owner's lock row {s(lock.get('id', '?'))}")


def recheck(r: RecheckResult, out: Out) -> None:
    out.table(
        ["assertion", "result", "observed"],
        [[a["name"], "PASS" if a["passed"] else "FAIL", a["observed"]] for a in r.assertions],
    )
    if not r.up:
        verdict = f"UNAVAILABLE, could not observe: {s(r.unavailable)}"
    elif r.needs_recover and r.phase == "qualifying":
        verdict = (
            "NEEDS RECOVER: a `load --promote` was interrupted before its promotion and the slot is "
            "dark for its clients; `anvilctl recover` finishes it"
        )
    elif r.needs_recover:
        verdict = "NEEDS RECOVER: the watched promote's owner is gone; `anvilctl recover` resumes it"
    elif r.passed:
        verdict = "all assertions hold"
    else:
        verdict = "DRIFT: " + ", ".join(s(f) for f in r.failed)
    recorded = f"recorded as recheck {r.recheck_id}" if r.recheck_id is not None else "NOT recorded"
    out.line(f"recheck of slot {s(r.slot)} ({s(r.phase)}): {verdict} ({recorded})")
    if r.audit_head:
        out.line(f"audit head {s(r.audit_head)}")


def chain(view: views.ChainCheck, out: Out) -> None:
    d = view.data
    how = d["mode"] if not d.get("escalated") else f"{d['mode']}, walked everything: {d['escalated']}"
    checked = f"{d['entries_checked']} entries and {d['rows_checked']} rows checked ({s(how)})"
    if view.ok:
        out.line(f"audit journal: {d['entries']} entries, hash chain intact; {checked}")
    else:
        problems = records(d["problems"])
        out.line(f"audit journal: DRIFT, {len(problems)} problem(s); {checked}")
        for p in problems:
            where = ", ".join(
                f"{name} {cell(p.get(key))}"
                for name, key in (("entry", "row_id"), ("table", "table"), ("key", "key"))
                if p.get(key) is not None
            )
            out.line(f"  {s(p.get('problem'))}" + (f" ({where})" if where else ""))
    out.line(f"  head       {s(d['head'])}")
    head_file = record(d.get("head_file"))
    if head_file.get("path"):
        recorded = head_file.get("head") or "missing"
        out.line(f"  head file  {s(head_file['path'])}: {s(recorded)}")
    if d.get("checkpoint"):
        checkpoint = record(d["checkpoint"])
        out.line(f"  checkpoint {s(checkpoint['id'])} recorded at {s(checkpoint['head'])}")
    elif d.get("checkpoint_error"):
        out.line(f"  checkpoint not recorded: {s(d['checkpoint_error'])}")
    for h in records(d.get("hosts") or []):  # the fleet's one chain: entries per host asked about
        out.line(f"  host       {s(h.get('host'))}: {s(h.get('entries'))} entries")
