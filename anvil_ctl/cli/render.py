"""Human and JSON rendering of command results, chosen by the result's type.

`RENDERERS` is keyed by qualified name (rendering `status` must not import qualify), looked up
along the MRO; anything else prints as `key: value` lines. `--json` prints `payload(result)`.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass

from anvil_ctl.cli import render_qualify as rq
from anvil_ctl.cli import render_tx as rt
from anvil_ctl.cli import views
from anvil_ctl.cli.output import Out, lines_of, s
from anvil_ctl.cli.views import items, record, records
from anvil_ctl.core.jsontypes import JSONValue
from anvil_ctl.core.validate import escape_text

Renderer = Callable[..., None]
"""A human renderer: `(result, out)`, the result of the type it is registered for."""


def payload(result: object) -> object:
    """What `--json` prints for a result."""
    if isinstance(result, views.View):
        return result.payload()
    as_dict = getattr(result, "as_dict", None)
    if callable(as_dict):
        return as_dict()
    if is_dataclass(result) and not isinstance(result, type):
        return asdict(result)
    return result


def _json_default(o: object) -> object:
    converted = payload(o)
    return str(o) if converted is o else converted


def to_json(result: object) -> str:
    return json.dumps(payload(result), indent=2, sort_keys=True, default=_json_default)


def show(result: object, as_json: bool, *, wide: bool = False) -> None:
    """Print a command's result: JSON, or the human renderer of its type."""
    if result is None:
        return
    if as_json:
        print(to_json(result))
        return
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    renderer_for(type(result))(result, Out(width, wide))


def renderer_for(kind: type) -> Renderer:
    for klass in kind.__mro__:
        found = RENDERERS.get(f"{klass.__module__}.{klass.__qualname__}")
        if found is not None:
            return found
    return _record_of


def _record_of(result: object, out: Out) -> None:
    """Anything without a renderer of its own: its payload as `key: value` lines."""
    data: JSONValue = json.loads(json.dumps(payload(result), default=_json_default))
    if isinstance(data, dict):
        for text in lines_of(data):
            out.line(text)
    elif isinstance(data, list) and all(isinstance(r, dict) for r in data):
        _table(views.Table(records(data)), out)
    else:
        out.line(s(data) if not isinstance(data, list) else ", ".join(s(v) for v in data))


def _table(t: views.Table, out: Out) -> None:
    rows = t.human_rows()
    cols = list(t.columns or (rows[0] if rows else ()))
    out.table(cols, [[row.get(c) for c in cols] for row in rows])


def _text(t: views.Text, out: Out) -> None:
    text = escape_text(t.text, keep_newlines=True)
    print(text, end="" if text.endswith("\n") else "\n")


def _where(data: Mapping[str, object], out: Out) -> None:
    state, config = record(data.get("state")), record(data.get("config"))
    if state:
        out.line(f"state database  {s(state['db'])}  ({s(state['origin'])})")
    if config:
        exists = "" if config.get("exists", True) else ", not found"
        out.line(f"host config     {s(config['path'])}  ({s(config['origin'])}{exists})")


def _status(view: views.StatusView, out: Out) -> None:
    for name, slot_data in record(view.data["slots"]).items():
        slot = record(slot_data)
        serving = record(slot["serving"])
        models = ", ".join(_served(pair) for pair in items(serving["models"])) or "nothing"
        out.line(
            f"slot {s(name)}: {s(slot['binding'])} serves {models} "
            f"({'healthy' if serving['healthy'] else 'NOT healthy'}); "
            f"tier {s(slot['router_tier'])} for {', '.join(s(a) for a in items(slot['aliases']))}"
        )
        inc = record(slot.get("incumbent"))
        if inc:
            out.line(
                f"  incumbent: {s(str(inc['container_id'])[:12])} {s(inc['served_model'])} "
                f"[{s(inc['status'])}] identity {s(str(inc['identity_digest'])[:12])}"
            )
        else:
            out.line("  incumbent: none recorded (adopt the serving container first)")
        rows = [
            [c["container_id"], c["name"], c.get("role"), c["status"], c["image_id"]]
            for c in records(slot["containers"])
        ]
        if rows:
            out.table(["container", "name", "role", "status", "image"], rows, indent="  ")
        router = record(slot.get("router"))
        backends = router.get("backends")
        if backends is not None:
            routed = (
                ", ".join(f"{s(b.get('url'))} -> {s(b.get('observed_model'))}" for b in records(backends))
                or "no backend"
            )
            out.line(f"  router: {routed}")
        elif router.get("error"):
            out.line(f"  router: UNAVAILABLE: {s(router['error'])}")
        for tx in records(slot.get("open")):
            out.line(f"  open: {s(tx['kind'])} {s(tx['tx_id'])} [{s(tx['state'])}]")
    if view.data.get("observed_at"):
        out.line(f"observed at     {s(view.data['observed_at'])}")
    _where(view.data, out)


def _served(pair: object) -> str:
    """A served model and its context, `(model, tokens)`, as `model (N tokens)`."""
    model, tokens = items(pair)
    return f"{s(model)} ({tokens} tokens)" if tokens else s(model)


def _init(view: views.InitView, out: Out) -> None:
    d = view.data
    if d.get("from") is None:
        out.line(f"created the state database at schema revision {s(d['to'])}")
    elif d["from"] == d["to"]:
        out.line(f"the state database is at the current schema revision {s(d['to'])}")
    else:
        out.line(f"upgraded the state database from schema revision {s(d['from'])} to {s(d['to'])}")
    _where(d, out)
    out.line(f"audit head      {s(d.get('audit_head'))}")
    if d.get("stale_head_file"):
        out.line(f"set aside the head file of an earlier database: {s(d['stale_head_file'])}")
    if d.get("gpu_roles"):
        out.line("gpu roles:")
        for text in lines_of(record(d["gpu_roles"]), "  ", skip=("toml",)):
            out.line(text)


RENDERERS: dict[str, Renderer] = {
    "anvil_ctl.cli.views.Table": _table,
    "anvil_ctl.cli.views.Text": _text,
    "anvil_ctl.cli.views.StatusView": _status,
    "anvil_ctl.cli.views.InitView": _init,
    "anvil_ctl.cli.views.DiffView": rt.diffs,
    "anvil_ctl.cli.views.TransactionView": rt.transaction,
    "anvil_ctl.cli.views.ChainCheck": rt.chain,
    "anvil_ctl.cli.views.GpuReadings": rq.gpu_readings,
    "anvil_ctl.cli.views.DetectedRoles": rq.detected_roles,
    "anvil_ctl.cli.views.EvidenceAudit": rq.evidence_audit,
    "anvil_ctl.engine.outcome.Outcome": rt.outcome,
    "anvil_ctl.engine.recover.RecoverReport": rt.recover,
    "anvil_ctl.commands.recheck.RecheckResult": rt.recheck,
    "anvil_ctl.commands.qualify.QualifyOutcome": rq.qualify,
    "anvil_ctl.commands.qualify.AbOutcome": rq.ab,
    "anvil_ctl.commands.recipes.RecipeView": rq.recipe_view,
    "anvil_ctl.commands.recipes.ValidationReport": rq.validation,
    "anvil_ctl.commands.recipes.Plan": rq.recipe_plan,
    "anvil_ctl.evidence.bundle.ExportResult": rq.export,
    "anvil_ctl.evidence.claims.ClaimsCheck": rq.claims,
    "anvil_ctl.commands.evidence.ReportResult": rq.report,
    "anvil_ctl.evidence.bundle.VerifyResult": rq.verify,
}
