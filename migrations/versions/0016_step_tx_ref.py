"""step rows name their transaction by an integer: the key of its first state row

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

From now on a step row (`step_events`, a dozen per transaction) names its transaction by
`tx_ref`, the integer key of the transaction's first (`planned`) state row, which names the
transaction by its ID, and leaves `tx_id` NULL (`persistence.txref`): 36 characters of text
fewer per row, and an index of small ascending integers instead of random text that filled
its pages half way. A row's digest covers `tx_ref` (NULL columns are left out, so every row
written before keeps its digest), and the state row's digest covers the ID. Rows written
before name the transaction by `tx_id`; each form has its own partial index, and `v_steps`
shows the transaction's ID for both (rows named by ID first: they are the older ones), so
the README's step query reads as before and still searches an index.

On SQLite `tx_id` loses its NOT NULL by copying the table (same rows, same keys; its
triggers made again); on PostgreSQL by ALTER COLUMN. anvilctl before 0016 cannot find the
steps of the new form (a transaction would seem to have none, and `recover` would act on
that), so this revision makes it refuse the database ("written by a newer version").

A downgrade keeps every row: the column and the rows of the new form stay (history is not
rewritten; anvilctl before 0016 cannot read them), `ix_step_events_tx_id_id` covers every
row again, and `v_steps` is 0015's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import allow_rewrites, drop_append_only, make_append_only, refuse_rewrites
from anvil_ctl.persistence.models import Base

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

STEPS = "step_events"
COLUMNS = "id, tx_id, seq, step, phase, event, detail_json, at, host_id"


def _at(dialect: str) -> str:
    """`e.at` as `v_steps` shows it: text. On SQLite, which stores it compactly from 0013 on,
    migration 0013's expression (a revision's module cannot be imported by name)."""
    if dialect != "sqlite":
        return "e.at"
    micros = (
        "("
        + " | ".join(
            f"((instr('0123456789ABCDEF', substr(hex(e.at), {k}, 1)) - 1) << {4 * (16 - k)})"
            for k in range(1, 17)
        )
        + ")"
    )
    return (
        "CASE WHEN typeof(e.at) = 'blob' AND length(e.at) = 8 THEN "
        f"strftime('%Y-%m-%dT%H:%M:%S', {micros} / 1000000, 'unixepoch') "
        f"|| printf('.%06dZ', {micros} % 1000000) ELSE e.at END"
    )


def _steps_view(dialect: str, *, refs: bool) -> None:
    op.execute("DROP VIEW IF EXISTS v_steps")
    at = _at(dialect)
    columns = f"e.seq, e.step, e.phase, e.event, {at} AS at, e.detail_json"
    if not refs:  # 0015's
        op.execute(f"CREATE VIEW v_steps AS SELECT e.tx_id, {columns} FROM step_events e")  # noqa: S608
        return
    # rows named by ID first: they are the older ones, so a transaction's steps read in order
    by_id = f"SELECT e.tx_id, {columns} FROM step_events e WHERE e.tx_id IS NOT NULL"  # noqa: S608
    by_ref = (
        f"SELECT s.tx_id, {columns} "  # noqa: S608
        "FROM transaction_states s JOIN step_events e ON e.tx_ref = s.id"
    )
    op.execute(f"CREATE VIEW v_steps AS {by_id} UNION ALL {by_ref}")


def _copy_steps_sqlite() -> None:
    """Rebuild `step_events` on SQLite: same rows and keys, `tx_id` nullable, `tx_ref` added."""
    drop_append_only(STEPS)
    allow_rewrites(STEPS)
    op.execute("DROP INDEX IF EXISTS ix_step_events_tx_id_id")
    op.execute(
        "CREATE TABLE step_events_copy (id INTEGER NOT NULL, tx_id VARCHAR(36), "
        "seq INTEGER NOT NULL, step VARCHAR(64) NOT NULL, phase VARCHAR(8) NOT NULL, "
        "event VARCHAR(16) NOT NULL, detail_json TEXT NOT NULL, at VARCHAR(32) NOT NULL, "
        "host_id SMALLINT REFERENCES hosts (id), tx_ref INTEGER, PRIMARY KEY (id), "
        "FOREIGN KEY(tx_id) REFERENCES transactions (id), "
        "FOREIGN KEY(tx_ref) REFERENCES transaction_states (id))"
    )
    op.execute(f"INSERT INTO step_events_copy ({COLUMNS}) SELECT {COLUMNS} FROM {STEPS} ORDER BY id")  # noqa: S608
    op.execute(f"DROP TABLE {STEPS}")
    op.execute(f"ALTER TABLE step_events_copy RENAME TO {STEPS}")
    make_append_only(STEPS)
    refuse_rewrites(Base.metadata.tables[STEPS])


def _partial(name: str, column: str) -> None:
    op.create_index(
        name,
        STEPS,
        [column, "id"],
        unique=False,
        sqlite_where=sa.text(f"{column} IS NOT NULL"),
        postgresql_where=sa.text(f"{column} IS NOT NULL"),
    )


def upgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    columns = {c["name"] for c in sa.inspect(bind).get_columns(STEPS)}
    op.execute("DROP VIEW IF EXISTS v_steps")  # it reads the table the copy replaces
    if "tx_ref" not in columns:  # a downgrade keeps it
        if dialect == "sqlite":
            _copy_steps_sqlite()
        else:
            op.alter_column(STEPS, "tx_id", existing_type=sa.String(length=36), nullable=True)
            op.add_column(STEPS, sa.Column("tx_ref", sa.Integer(), sa.ForeignKey("transaction_states.id")))
    op.execute("DROP INDEX IF EXISTS ix_step_events_tx_id_id")
    _partial("ix_step_events_tx_id_id", "tx_id")
    _partial("ix_step_events_tx_ref_id", "tx_ref")
    _steps_view(dialect, refs=True)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    _steps_view(dialect, refs=False)
    op.drop_index("ix_step_events_tx_ref_id", table_name=STEPS)
    op.drop_index("ix_step_events_tx_id_id", table_name=STEPS)
    op.create_index("ix_step_events_tx_id_id", STEPS, ["tx_id", "id"], unique=False)
