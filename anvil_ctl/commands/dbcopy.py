"""`anvilctl db copy --to URL`: this host's whole history into another state database
(`persistence.copy` says what is copied and how the chain is carried over)."""

from __future__ import annotations

from anvil_ctl.bootstrap import App
from anvil_ctl.config.fields import STATE_DB_RE
from anvil_ctl.core.errors import BadInput, RecordDiffers
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import unsafe_char
from anvil_ctl.persistence import hosts
from anvil_ctl.persistence import verify as chain
from anvil_ctl.persistence.copy import copy_host
from anvil_ctl.persistence.db import make_engine, where
from anvil_ctl.persistence.head import head_path_for
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.persistence.store import Store


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
            f"host {source.host_name!r} has no history in {where(source.engine)}: nothing to copy",
            field="host",
        )
    target = make_engine(to, create=True)
    try:
        if where(target) == where(source.engine):
            raise BadInput(f"--to {where(target)}: that is this host's own state database", field="--to")
        found = chain.verify(source, full=True)
        if not found.ok:
            raise RecordDiffers(
                f"this host's record in {where(source.engine)} does not verify ({len(found.problems)} "
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
                f"the copy in {where(target)} does not verify ({len(check.problems)} problems): run "
                "`anvilctl audit verify --full` against it",
                result=out,
                problems=[p.as_dict() for p in check.problems[:20]],
            )
        return out
    finally:
        target.dispose()
