"""init, db upgrade and status."""

from __future__ import annotations

from typing import Any

from anvil_ctl.bootstrap import Context
from anvil_ctl.core.errors import AdapterError, NotFound
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT
from anvil_ctl.engine.observe import router_view, serving
from anvil_ctl.persistence.head import head_path_for, set_aside
from anvil_ctl.persistence.migrate import current_revision, upgrade
from anvil_ctl.persistence.store import utcnow


def where(ctx: Context) -> dict[str, Any]:
    """Which state database and host config this command uses, and where each came from
    (a flag, ANVIL_*, or the default): `init` and `status` say it."""
    st = ctx.settings
    origin = ctx.origins.get("state_db" if st.state_db is not None else "state_dir", "given")
    db = ctx.engine.url.render_as_string(hide_password=True)
    return {
        "state": {"db": db, "dir": str(st.state_dir), "origin": origin},
        "config": {
            "path": str(st.config),
            "origin": ctx.origins.get("config", "given"),
            "exists": st.config.exists(),
        },
    }


def init(ctx: Context) -> dict[str, Any]:
    """Create or upgrade the state database (and the default state directory), and bring the
    audit head file in line with it.

    A new database starts a new chain: a head file left by an earlier database at the
    same place is set aside (renamed, never deleted), since it pins a chain that is gone.
    """
    engine = ctx.create_database()
    before, after = upgrade(engine)
    out: dict[str, Any] = {
        "db": engine.url.render_as_string(hide_password=True),
        "from": before,
        "to": after,
    }
    path = head_path_for(ctx.settings.db_url, ctx.settings.state_dir)
    if before is None:
        stale = set_aside(path, utcnow().replace(":", ""))
        if stale is not None:
            out["stale_head_file"] = str(stale)
    out["audit_head"] = str(ctx.store.sync_head_file())
    return {**out, **where(ctx)}


def db_upgrade(ctx: Context) -> dict[str, Any]:
    return init(ctx)


def db_revision(ctx: Context) -> dict[str, Any]:
    return {"revision": current_revision(ctx.engine)}


def status(ctx: Context) -> dict[str, Any]:
    world = ctx.world()
    slots: dict[str, Any] = {}
    for name, slot in sorted(ctx.config.slots.items()):
        incumbent = ctx.store.current_identity(name, "incumbent")
        entries = []
        for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: name}):
            entries.append(
                {
                    "container_id": c.id,
                    "name": c.name,
                    "status": c.status,
                    "role": c.labels.get("io.anvil.role"),
                    "image_id": c.image_id,
                }
            )
        inc: dict[str, Any] | None = None
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
        }
    return {"host": ctx.config.host, "slots": slots, "observed_at": utcnow(), **where(ctx)}
