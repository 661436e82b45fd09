"""The two PostgreSQL roles of a state database, as SQL for a person to run (`init --print-grants`).

The owner runs `init` and `db upgrade`. The application role may SELECT and INSERT history
(no UPDATE, DELETE, TRUNCATE, nor dropping a trigger) and also UPDATE and DELETE the derived
projection; what the owner can still do is what `audit verify` is for.
"""

# ruff: noqa: S608 -- this module writes SQL text for a person to run (names checked by ROLE_RE)
from __future__ import annotations

import re

from anvil_ctl.core.errors import BadInput
from anvil_ctl.persistence.current_models import PROJECTION_TABLES
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES

ROLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
"""A PostgreSQL name that needs no quoting: what these statements may name."""


def _ident(value: str, what: str) -> str:
    if not ROLE_RE.match(value):
        raise BadInput(
            f"{what}: expected a PostgreSQL name of lowercase letters, digits and '_' (at most 63), "
            f"got {value!r}",
            field=what,
        )
    return value


def app_grants(*, owner: str, app: str) -> list[str]:
    """The statements that give the application role its privileges, run as the owner after
    `anvilctl init` (and after each `db upgrade` that adds a table)."""
    owner = _ident(owner, "--owner-role")
    app = _ident(app, "--app-role")
    history = ", ".join(sorted(APPEND_ONLY_TABLES))  # the role may only INSERT and SELECT
    projection = ", ".join(sorted(PROJECTION_TABLES))
    return [
        "REVOKE ALL ON SCHEMA public FROM PUBLIC",
        f"GRANT USAGE ON SCHEMA public TO {app}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {app}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {app}",
        f"GRANT INSERT ON {history} TO {app}",
        f"GRANT INSERT, UPDATE, DELETE ON {projection} TO {app}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {app}",
    ]


def grants_sql(*, database: str, owner: str, app: str) -> str:
    """The SQL that creates both roles and the database and grants the application role its
    privileges; passwords are left for `\\password`, never printed."""
    database = _ident(database, "database")
    owner = _ident(owner, "--owner-role")
    app = _ident(app, "--app-role")
    if owner == app:
        raise BadInput("--app-role: must differ from the migration role (--owner-role)", field="--app-role")
    grants = ";\n".join(app_grants(owner=owner, app=app))
    return f"""\
-- anvilctl state database on PostgreSQL: two roles.
-- {owner}: owns the schema; `anvilctl init` and `anvilctl db upgrade` connect as it.
-- {app}: every other command; SELECT everything, INSERT history, nothing else on history.

-- 1. As a superuser, before `anvilctl init`:
CREATE ROLE {owner} LOGIN;
CREATE ROLE {app} LOGIN;
-- then set their passwords: \\password {owner}   and   \\password {app}
CREATE DATABASE {database} OWNER {owner};
REVOKE ALL ON DATABASE {database} FROM PUBLIC;
GRANT CONNECT ON DATABASE {database} TO {app};

-- 2. As {owner}: anvilctl --state-db 'postgresql+psycopg://{owner}@HOST/{database}' init

-- 3. Connected to {database} as {owner}, after `anvilctl init` (again after each
--    `anvilctl db upgrade`: a new table gets no privilege until this runs):
{grants};

-- 4. Every other command: ANVIL_STATE_DB='postgresql+psycopg://{app}:PASSWORD@HOST/{database}'
--    (percent-encode the password: % as %25, @ as %40, / as %2F, : as %3A; a unix socket
--    directory as ?host=/run/postgresql)
"""
