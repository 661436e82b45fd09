"""DDL the ORM cannot express: the append-only triggers that migrations make.

SQLite: `<t>_no_update`, `<t>_no_delete`, and `<t>_no_replace`, a BEFORE INSERT trigger on an
existing key (`INSERT OR REPLACE` deletes without firing DELETE triggers). PostgreSQL:
`<t>_append_only` (UPDATE, DELETE, upserts) and `<t>_no_truncate` (statement level).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table, UniqueConstraint


def make_append_only(table: Table) -> None:
    """Refuse every rewrite of a history table at the database (see the module doc)."""
    from alembic import op  # imported here: `audit verify` (`expected_triggers`) need not load alembic

    name = table.name
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {name}_no_{action.lower()} BEFORE {action} ON {name} "
                f"BEGIN SELECT RAISE(ABORT, '{name} is append-only'); END"
            )
        # NULL never equals anything, so an insert that lets SQLite choose the rowid passes.
        clash = " OR ".join(
            "(" + " AND ".join(f"{c} = NEW.{c}" for c in key) + ")" for key in unique_keys(table)
        )
        op.execute(  # names from our own metadata, never from input
            f"CREATE TRIGGER {name}_no_replace BEFORE INSERT ON {name} "  # noqa: S608
            f"WHEN EXISTS (SELECT 1 FROM {name} WHERE {clash}) "
            f"BEGIN SELECT RAISE(ABORT, '{name} is append-only: a row with this key exists'); END"
        )
    elif dialect == "postgresql":
        op.execute(
            "CREATE OR REPLACE FUNCTION anvil_append_only() RETURNS trigger AS $$ "
            "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END; $$ LANGUAGE plpgsql"
        )
        op.execute(
            f"CREATE TRIGGER {name}_append_only BEFORE UPDATE OR DELETE ON {name} "
            "FOR EACH ROW EXECUTE FUNCTION anvil_append_only()"
        )
        op.execute(
            f"CREATE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {name} "
            "FOR EACH STATEMENT EXECUTE FUNCTION anvil_append_only()"
        )


def unique_keys(table: Table) -> list[tuple[str, ...]]:
    """The column tuples a REPLACE could collide on: the primary key and every unique key (a
    column's `unique=True` is one of `table.constraints` too)."""
    keys = [tuple(c.name for c in table.primary_key.columns)]
    uniques = (tuple(c.name for c in u.columns) for u in table.constraints if isinstance(u, UniqueConstraint))
    return keys + [u for u in uniques if u not in keys]


def expected_triggers(dialect: str, tables: Sequence[str]) -> dict[str, str]:
    """trigger name -> table, for every append-only trigger the schema at head has."""
    suffixes = {
        "sqlite": ("no_update", "no_delete", "no_replace"),
        "postgresql": ("append_only", "no_truncate"),
    }.get(dialect, ())
    return {f"{t}_{s}": t for t in tables for s in suffixes}
