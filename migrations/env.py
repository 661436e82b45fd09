"""alembic environment: runs against the engine anvilctl passes in (or sqlalchemy.url)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from anvil_ctl.persistence.current_models import Base
from anvil_ctl.persistence.db import make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine: Engine | None = config.attributes.get("engine")
    if engine is None:
        engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        if connection.in_transaction():
            connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; anvilctl runs them against a database")
run_migrations_online()
