"""The schema is owned by alembic: upgrade, and refuse databases at unknown or newer revisions."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from anvil_ctl.core.errors import StateStoreError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # configparser interpolates %: a URL with an escaped socket path (%2F) must be doubled.
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision(engine: Engine) -> str:
    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_revision(engine: Engine, *, allow_empty: bool = False) -> str | None:
    """Refuse a database this program does not know: foreign, unknown revision, newer, or older."""
    script = ScriptDirectory.from_config(alembic_config(engine))
    known = {rev.revision for rev in script.walk_revisions()}
    current = current_revision(engine)
    url = engine.url.render_as_string(hide_password=True)
    if current is None:
        has_tables = bool(inspect(engine).get_table_names())
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
    before = check_revision(engine, allow_empty=True)
    command.upgrade(alembic_config(engine), "head")
    return before, head_revision(engine)
