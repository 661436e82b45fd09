"""The state database: SQLAlchemy models, the alembic-owned schema, and the journal store."""
