"""The schema is owned by alembic: upgrade, and refuse databases at unknown or newer revisions.

A database at `SCHEMA_REVISION` passes with one query, without loading alembic (slow to
import); anything else goes through alembic for the exact message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from anvil_ctl.core.errors import StateStoreError, Unavailable
from anvil_ctl.persistence.db import database_error, reader, translated
from anvil_ctl.places import MIGRATIONS_DIR

if TYPE_CHECKING:
    from alembic.config import Config

SCHEMA_REVISION = "baseline"

RETIRED = frozenset(f"{n:04d}" for n in range(1, 22))
"""The revisions of development versions before the baseline: their encodings have no reader."""


def _stamped(engine: Engine) -> str | None:
    """The revision alembic stamped into the database, without alembic; None if none. A read:
    it never waits for another process's write lock."""
    try:
        with reader(engine).connect() as conn:
            value = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError as exc:
        if isinstance(ours := database_error(engine, exc), Unavailable):
            raise ours from exc  # locked, unreadable: asking alembic would only wait again
        return None  # no alembic_version table (yet): let alembic say what this is
    return str(value) if value is not None else None


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # configparser interpolates %: a URL with an escaped socket path (%2F) must be doubled.
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision(engine: Engine) -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def check_revision(engine: Engine, *, allow_empty: bool = False) -> str | None:
    """Refuse a database this program does not know: foreign, unknown revision, newer, or older."""
    if _stamped(engine) == SCHEMA_REVISION:
        return SCHEMA_REVISION
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(engine))
    known = {rev.revision for rev in script.walk_revisions()}
    with translated(engine), reader(engine).connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
        has_tables = bool(inspect(conn).get_table_names())
    url = engine.url.render_as_string(hide_password=True)
    if current in RETIRED:
        raise StateStoreError(
            f"{url}: database is at revision {current}, written by a development version of anvilctl "
            f"before its {SCHEMA_REVISION} schema; this anvilctl cannot read it. Keep the file as "
            "evidence and create a new state database with `anvilctl init`"
        )
    if current is None:
        if has_tables:
            raise StateStoreError(f"{url}: has tables but no alembic revision; not an anvil state db")
        if allow_empty:
            return None
        raise StateStoreError(f"{url}: state database not initialised; run `anvilctl init`")
    if current not in known:
        raise StateStoreError(
            f"{url}: database is at revision {current}, unknown to this anvilctl "
            f"(head {script.get_current_head()}); it was written by a newer version"
        )
    head = script.get_current_head()
    if current != head and not allow_empty:
        raise StateStoreError(
            f"{url}: database is at revision {current}, older than {head}; run `anvilctl db upgrade`"
        )
    return current


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Upgrade to head; return (from, to). Refuses unknown/newer revisions first."""
    from alembic import command

    before = check_revision(engine, allow_empty=True)
    with translated(engine):
        command.upgrade(alembic_config(engine), "head")
    return before, head_revision(engine)
