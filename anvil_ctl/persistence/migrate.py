"""The schema is owned by alembic: upgrade, and refuse databases at unknown or newer revisions.

Only `init` and `db upgrade` import alembic (with mako and its dialect modules, ~0.3 s).
Every other command checks the revision with a plain query of `alembic_version`
against the revisions read from the migration files themselves (`known_revisions`;
a test holds it equal to what alembic reads).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, column, inspect, select, table

from anvil_ctl.core.errors import StateStoreError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
VERSION_TABLE = "alembic_version"
_REVISION = re.compile(r"""^(down_revision|revision)\s*(?::[^=]*)?=\s*(?:['"]([^'"]+)['"]|None)\s*$""", re.M)


@cache
def known_revisions(versions: Path = MIGRATIONS_DIR / "versions") -> tuple[frozenset[str], str]:
    """(every revision, the head) as the migration files declare them, without alembic."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted(versions.glob("*.py")):
        found = {m.group(1): m.group(2) for m in _REVISION.finditer(path.read_text())}
        if found.get("revision"):
            revisions.add(found["revision"])
            if found.get("down_revision"):
                parents.add(found["down_revision"])
    heads = revisions - parents
    if len(heads) != 1:
        raise StateStoreError(f"{versions}: expected one head revision, found {sorted(heads)}")
    return frozenset(revisions), heads.pop()


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision(engine: Engine) -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in `alembic_version` (None: no such table or no row)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        version = table(VERSION_TABLE, column("version_num"))
        rows = [str(r) for r in conn.execute(select(version.c.version_num)).scalars()]
    if len(rows) > 1:
        url = engine.url.render_as_string(hide_password=True)
        raise StateStoreError(f"{url}: stamped at several revisions {sorted(rows)}; not an anvil state db")
    return rows[0] if rows else None


def check_revision(engine: Engine, *, allow_empty: bool = False) -> str | None:
    """Refuse a database this program does not know: foreign, unknown revision, newer, or older."""
    known, head = known_revisions()
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
            f"(head {head}); it was written by a newer version"
        )
    if current != head and not allow_empty:
        raise StateStoreError(
            f"{url}: database is at revision {current}, older than {head}; run `anvilctl db upgrade`"
        )
    return current


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Upgrade to head; return (from, to). Refuses unknown/newer revisions first."""
    from alembic import command

    before = check_revision(engine, allow_empty=True)
    command.upgrade(alembic_config(engine), "head")
    return before, head_revision(engine)
