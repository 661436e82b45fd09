"""operator views: promotions with their decisions and waivers; serving history by alias

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE VIEW v_promotions AS
        SELECT t.tx_id, t.state, t.created_at, t.slot, a.approved_by, a.decision_id,
               d.outcome, d.reclassifies, d.waiver_ids_json,
               CASE WHEN d.waiver_ids_json <> '[]' THEN 1 ELSE 0 END AS relied_on_waiver
        FROM v_transactions t
        JOIN approvals a ON a.tx_id = t.tx_id
        JOIN decisions d ON d.id = a.decision_id
        WHERE t.kind = 'promote'
        """
    )
    # Each incumbent recorded by a committed transaction, with the time the next one
    # replaced it: "who served when". Records of compensated transactions do not count.
    op.execute(
        """
        CREATE VIEW v_serving_history AS
        SELECT c.slot, c.container_id, c.served_model, c.image_id, c.digest,
               c.identity_json, c.tx_id, c.at AS served_from,
               LEAD(c.at) OVER (PARTITION BY c.slot ORDER BY c.id) AS served_until
        FROM (
            SELECT i.id, i.slot, i.container_id, i.served_model, i.image_id, i.digest,
                   i.body_json AS identity_json, i.tx_id, i.at
            FROM identities i JOIN v_transactions t ON t.tx_id = i.tx_id
            WHERE i.role = 'incumbent' AND t.state = 'committed'
              AND i.id = (SELECT max(j.id) FROM identities j
                          WHERE j.tx_id = i.tx_id AND j.role = 'incumbent')
        ) c
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_serving_history")
    op.execute("DROP VIEW IF EXISTS v_promotions")
