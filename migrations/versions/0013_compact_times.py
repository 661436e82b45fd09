"""compact history times: a history row's `at` as 8 bytes on SQLite

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

From now on, on SQLite, the `at` of the many-row history tables that no README query
compares as text (`step_events`, `transaction_states`, `gpu_ownership_events`,
`snapshots`, `snapshot_blobs`, `snapshot_diffs`, `identity_bodies`, `lock_releases`,
`approvals`) is stored as `coltypes.CompactTime`: 8 bytes, microseconds since the epoch,
big-endian (the journal's form since 0011), read back as the `utcnow()` text a row's
digest covers; a value that would not read back the same, and every row written before,
stays text. No column is added. `v_steps`, the one view that shows such a time, shows
it as text either way (the expression below: SQLite 3.40 has no `unhex`), so the
README's step query reads as before. `identities.at` (`v_identities.recorded_at`) and
the times other views or queries order or compare by stay text. PostgreSQL stores text,
as before: only its revision changes.

anvilctl before 0013 cannot read those rows (a time would read as bytes, and `audit
verify` would report the rows), so this revision makes it refuse the database ("written by
a newer version") instead. A downgrade restores the plain `v_steps`; rows written
compactly stay (history is not rewritten), and anvilctl before 0013 cannot read them.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_PLAIN_STEPS = """
        CREATE VIEW v_steps AS
        SELECT e.tx_id, e.seq, e.step, e.phase, e.event, e.at, e.detail_json
        FROM step_events e
"""


def _micros(col: str) -> str:
    """SQL: the integer an 8-byte big-endian BLOB holds, one hex digit at a time."""
    digits = [
        f"((instr('0123456789ABCDEF', substr(hex({col}), {k}, 1)) - 1) << {4 * (16 - k)})"
        for k in range(1, 17)
    ]
    return "(" + " | ".join(digits) + ")"


def time_text(col: str) -> str:
    """SQL: a `CompactTime` value as its text (`2026-09-02T12:15:45.123456Z`), text as it is."""
    micros = _micros(col)
    return (
        f"CASE WHEN typeof({col}) = 'blob' AND length({col}) = 8 THEN "
        f"strftime('%Y-%m-%dT%H:%M:%S', {micros} / 1000000, 'unixepoch') "
        f"|| printf('.%06dZ', {micros} % 1000000) ELSE {col} END"
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("DROP VIEW IF EXISTS v_steps")
    op.execute(
        f"""
        CREATE VIEW v_steps AS
        SELECT e.tx_id, e.seq, e.step, e.phase, e.event, {time_text("e.at")} AS at, e.detail_json
        FROM step_events e
"""
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("DROP VIEW IF EXISTS v_steps")
    op.execute(_PLAIN_STEPS)
