"""compact identities: an identity's digest, container and image IDs as bytes on SQLite

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

From now on, on SQLite, an `identities` row (two a transaction) stores its `digest` and
`container_id` (64 hex digits each) as their 32 bytes (`coltypes.HexDigest`) and its
`image_id` (`sha256:` and 64 hex digits) as the digest's 32 bytes (`coltypes.ImageId`),
read back as the text its row digest covers; a value that would not read back the same,
and every row written before, stays text. `v_identities` and `v_serving_history` show the
text for both forms (the expressions below), and `v_serving_history` still finds an
identity's body by its digest; the projection rebuild decodes them (by column). No column
is added; PostgreSQL stores text, and its views are unchanged.

anvilctl before 0017 cannot read those rows (an ID would read as bytes, and `audit verify`
would report the rows), so this revision makes it refuse the database ("written by a newer
version") instead. A downgrade restores the views of 0016 (which show a compact value as
stored); rows written compactly stay, and anvilctl before 0017 cannot read them.
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def _hex(col: str) -> str:
    """SQL: a `HexDigest` value as its text (64 hex digits), text as it is."""
    return f"CASE WHEN typeof({col}) = 'blob' THEN lower(hex({col})) ELSE {col} END"


def _image(col: str) -> str:
    """SQL: an `ImageId` value as its text (`sha256:` and 64 hex digits), text as it is."""
    return f"CASE WHEN typeof({col}) = 'blob' THEN 'sha256:' || lower(hex({col})) ELSE {col} END"


def _plain(col: str) -> str:
    return col


def _views(*, compact: bool) -> None:
    as_hex, as_image = (_hex, _image) if compact else (_plain, _plain)
    op.execute("DROP VIEW IF EXISTS v_identities")
    op.execute(
        f"""
        CREATE VIEW v_identities AS
        SELECT i.id, i.slot, i.role, {as_hex("i.container_id")} AS container_id,
               {as_image("i.image_id")} AS image_id, i.served_model,
               {as_hex("i.digest")} AS digest, i.tx_id, i.at AS recorded_at,
               coalesce(i.host_id, 1) AS host_id, h.name AS host
        FROM identities i LEFT JOIN hosts h ON h.id = coalesce(i.host_id, 1)
        """
    )
    op.execute("DROP VIEW IF EXISTS v_serving_history")
    op.execute(
        f"""
        CREATE VIEW v_serving_history AS
        SELECT serving_intervals.slot, {as_hex("identities.container_id")} AS container_id,
               identities.served_model, {as_image("identities.image_id")} AS image_id,
               {as_hex("identities.digest")} AS digest,
               COALESCE(NULLIF(identities.body_json, ''), identity_bodies.body_json) AS identity_json,
               serving_intervals.tx_id, serving_intervals.served_from, serving_intervals.served_until,
               serving_intervals.host_id, h.name AS host
        FROM serving_intervals JOIN identities ON identities.id = serving_intervals.identity_id
        LEFT JOIN identity_bodies ON identity_bodies.digest = {as_hex("identities.digest")}
        LEFT JOIN hosts h ON h.id = serving_intervals.host_id
        """
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    _views(compact=True)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    _views(compact=False)
