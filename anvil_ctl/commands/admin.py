"""init, db upgrade, db copy and status."""

from __future__ import annotations

from anvil_ctl.bootstrap import App
from anvil_ctl.config.fields import STATE_DB_RE
from anvil_ctl.core.errors import AdapterError, BadInput, NotFound, RecordDiffers
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT
from anvil_ctl.core.validate import unsafe_char
from anvil_ctl.engine.observe import router_view, serving
from anvil_ctl.persistence import hosts
from anvil_ctl.persistence import verify as chain
from anvil_ctl.persistence.copy import copy_host
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.db import where as db_where
from anvil_ctl.persistence.head import head_path_for, set_aside
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.persistence.store import Store, utcnow


def where(app: App) -> JSONObject:
    """Which state database (db, dir) and host config (path, exists) this command uses, and
    where each came from (`origin`: a flag, ANVIL_*, or the default): `init` and `status` say it."""
    st = app.settings
    origin = app.origins.get("state_db" if st.state_db is not None else "state_dir", "given")
    db = app.database.url.render_as_string(hide_password=True)
    return {
        "state": {"db": db, "dir": str(st.state_dir), "origin": origin},
        "config": {
            "path": str(st.config),
            "origin": app.origins.get("config", "given"),
            "exists": st.config.exists(),
        },
    }


def init(app: App) -> JSONObject:
    """Create or upgrade the state database and bring the audit head file in line with it; a new
    database sets aside (renames) the head file of an earlier one, whose chain is gone. Says the
    database, the migration it ran (from, to), the audit head and `where`; `stale_head_file`:
    where a set-aside head file went."""
    engine = app.create_database()
    before, after = upgrade(engine)
    path = head_path_for(app.settings.db_url, app.settings.state_dir)
    stale = set_aside(path, utcnow().replace(":", "")) if before is None else None
    app.store.register()  # this host, with its machine id (or checked against it)
    audit_head = str(app.store.sync_head_file())
    result: JSONObject = {
        "db": engine.url.render_as_string(hide_password=True),
        "from": before,
        "to": after,
        "audit_head": audit_head,
        **where(app),
    }
    if stale is not None:
        result["stale_head_file"] = str(stale)
    return result


def print_grants(*, database: str, owner: str, app: str) -> str:
    """The SQL for PostgreSQL's migration and application roles (`persistence.grants`);
    touches no database."""
    from anvil_ctl.persistence.grants import grants_sql

    return grants_sql(database=database, owner=owner, app=app)


def status(app: App) -> dict[str, object]:
    """Per slot: its binding, tier and aliases, its recorded incumbent (and that container's
    status now), its managed containers, what its binding serves, the router's view and its
    unfinished transactions (a promote `watching`); and `where`."""
    world = app.world()
    slots: dict[str, object] = {}
    unfinished = app.store.unfinished()
    for name, slot in sorted(app.config.slots.items()):
        incumbent = app.store.current_identity(name, "incumbent")
        entries = [
            {
                "container_id": c.id,
                "name": c.name,
                "status": c.status,
                "role": c.labels.get("io.anvil.role"),
                "image_id": c.image_id,
            }
            for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: name})
        ]
        inc: dict[str, object] | None = None
        if incumbent:
            st: str
            try:
                st = world.runtime.inspect(incumbent.container_id).status
            except NotFound:
                st = "absent"
            inc = {**incumbent.as_dict(), "status": st, "identity_digest": incumbent.digest}
        try:
            router = router_view(world, slot.router_tier)
        except AdapterError as exc:
            router = {"error": str(exc)}
        slots[name] = {
            "binding": slot.binding,
            "router_tier": slot.router_tier,
            "aliases": list(slot.aliases),
            "incumbent": inc,
            "containers": entries,
            "serving": serving(world, slot.base_url),
            "router": router,
            "open": [
                {"tx_id": r.id, "kind": r.kind, "state": r.state.value} for r in unfinished if r.slot == name
            ],
        }
    return {"host": app.config.host, "slots": slots, "observed_at": utcnow(), **where(app)}


def db_copy(app: App, *, to: str) -> JSONObject:
    """Verify this host's record (in full), copy it into `to` (migrated to the head first),
    verify the target (in full); rows copied per table, both heads. The password of either
    URL is never printed."""
    if unsafe_char(to) is not None or not STATE_DB_RE.match(to):
        raise BadInput(
            "--to: expected a database URL: sqlite:///PATH or postgresql://USER@HOST/DB", field="--to"
        )
    source = app.store
    if source.unregistered:
        raise BadInput(
            f"host {source.host_name!r} has no history in {db_where(source.engine)}: nothing to copy",
            field="host",
        )
    target = make_engine(to, create=True)
    try:
        if db_where(target) == db_where(source.engine):
            raise BadInput(f"--to {db_where(target)}: that is this host's own state database", field="--to")
        found = chain.verify(source, full=True)
        if not found.ok:
            raise RecordDiffers(
                f"this host's record in {db_where(source.engine)} does not verify ({len(found.problems)} "
                "problems; run `anvilctl audit verify --full`): nothing was copied",
                problems=[p.as_dict() for p in found.problems[:20]],
            )
        before, after = upgrade(target)
        result = copy_host(source, target)
        # the head file this host will keep for the target (beside an SQLite file, else in
        # the state directory), so that its next `audit verify` there has a witness
        copied = Store(target, head_path=head_path_for(to, app.settings.state_dir))
        registered = hosts.by_name(copied, result.host)
        copied.host_id = registered.id if registered is not None else None
        copied.sync_head_file()
        check = chain.verify(copied, full=True)
        copied.sync_head_file()
        out = result.as_dict()
        out["migrated"] = {"from": before, "to": after}
        out["target_head"] = str(check.head)
        out["target_verified"] = {
            "ok": check.ok,
            "entries_checked": check.entries_checked,
            "rows_checked": check.rows_checked,
        }
        if not check.ok:
            raise RecordDiffers(
                f"the copy in {db_where(target)} does not verify ({len(check.problems)} problems): run "
                "`anvilctl audit verify --full` against it",
                result=out,
                problems=[p.as_dict() for p in check.problems[:20]],
            )
        return out
    finally:
        target.dispose()
