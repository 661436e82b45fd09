"""qualification: gpu ownership, evidence, decisions, waivers, approvals, rechecks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 21:59:11.313302
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import drop_append_only, make_append_only
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES_0002


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('gpu_ownership_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('role', sa.String(length=64), nullable=False),
    sa.Column('event', sa.String(length=16), nullable=False),
    sa.Column('container_id', sa.String(length=64), nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('slot', sa.String(length=64), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('gpu_ownership_events', schema=None) as batch_op:
        batch_op.create_index('ix_gpu_ownership_role_id', ['role', 'id'], unique=False)

    op.create_table('rechecks',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('slot', sa.String(length=64), nullable=False),
    sa.Column('passed', sa.Integer(), nullable=False),
    sa.Column('failed_json', sa.Text(), nullable=False),
    sa.Column('assertions_json', sa.Text(), nullable=False),
    sa.Column('snapshot_sha256', sa.String(length=64), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rechecks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rechecks_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_rechecks_slot'), ['slot'], unique=False)

    op.create_table('waivers',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('policy', sa.String(length=32), nullable=False),
    sa.Column('roles_json', sa.Text(), nullable=False),
    sa.Column('recipe_digest', sa.String(length=64), nullable=True),
    sa.Column('value', sa.Integer(), nullable=False),
    sa.Column('approved_by', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.String(length=32), nullable=False),
    sa.Column('expires_at', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('decisions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('slot', sa.String(length=64), nullable=False),
    sa.Column('identity_digest', sa.String(length=64), nullable=False),
    sa.Column('container_id', sa.String(length=64), nullable=False),
    sa.Column('outcome', sa.String(length=32), nullable=False),
    sa.Column('profile', sa.String(length=64), nullable=False),
    sa.Column('manifest_sha256', sa.String(length=64), nullable=False),
    sa.Column('reclassifies', sa.String(length=64), nullable=True),
    sa.Column('waiver_ids_json', sa.Text(), nullable=False),
    sa.Column('reasons_json', sa.Text(), nullable=False),
    sa.Column('body_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['reclassifies'], ['decisions.id'], ),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_identity_digest'), ['identity_digest'], unique=False)
        batch_op.create_index(batch_op.f('ix_decisions_tx_id'), ['tx_id'], unique=False)

    op.create_table('evidence',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=False),
    sa.Column('gate', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('passed', sa.Integer(), nullable=False),
    sa.Column('classification', sa.String(length=64), nullable=False),
    sa.Column('artifact_path', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('evidence', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evidence_tx_id'), ['tx_id'], unique=False)

    op.create_table('waiver_revocations',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('waiver_id', sa.String(length=36), nullable=False),
    sa.Column('by', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['waiver_id'], ['waivers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('waiver_id')
    )
    op.create_table('approvals',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=False),
    sa.Column('decision_id', sa.String(length=64), nullable=False),
    sa.Column('approved_by', sa.String(length=255), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['decision_id'], ['decisions.id'], ),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_approvals_tx_id'), ['tx_id'], unique=False)


    for table in APPEND_ONLY_TABLES_0002:
        make_append_only(table)
    op.execute(
        """
        CREATE VIEW v_gpu_owners AS
        SELECT e.role, e.container_id, e.tx_id, e.mode, e.slot, e.at AS since
        FROM gpu_ownership_events e
        WHERE e.event = 'claim'
          AND e.id = (SELECT max(x.id) FROM gpu_ownership_events x WHERE x.role = e.role)
        """
    )
    op.execute(
        """
        CREATE VIEW v_decisions AS
        SELECT d.id AS decision_id, d.tx_id, d.slot, d.identity_digest, d.container_id,
               d.outcome, d.profile, d.reclassifies, d.waiver_ids_json, d.reasons_json,
               d.at AS decided_at
        FROM decisions d
        """
    )
    op.execute(
        """
        CREATE VIEW v_waivers AS
        SELECT w.id AS waiver_id, w.policy, w.roles_json, w.recipe_digest, w.value,
               w.approved_by, w.reason, w.created_at, w.expires_at,
               r.at AS revoked_at, r.by AS revoked_by
        FROM waivers w LEFT JOIN waiver_revocations r ON r.waiver_id = w.id
        """
    )
    op.execute(
        """
        CREATE VIEW v_rechecks AS
        SELECT id, slot, passed, failed_json, snapshot_sha256, at FROM rechecks
        """
    )

def downgrade() -> None:
    for view in ("v_rechecks", "v_waivers", "v_decisions", "v_gpu_owners"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    for table in APPEND_ONLY_TABLES_0002:
        drop_append_only(table)
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_approvals_tx_id'))

    op.drop_table('approvals')
    op.drop_table('waiver_revocations')
    with op.batch_alter_table('evidence', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evidence_tx_id'))

    op.drop_table('evidence')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_tx_id'))
        batch_op.drop_index(batch_op.f('ix_decisions_identity_digest'))

    op.drop_table('decisions')
    op.drop_table('waivers')
    with op.batch_alter_table('rechecks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rechecks_slot'))
        batch_op.drop_index(batch_op.f('ix_rechecks_at'))

    op.drop_table('rechecks')
    with op.batch_alter_table('gpu_ownership_events', schema=None) as batch_op:
        batch_op.drop_index('ix_gpu_ownership_role_id')

    op.drop_table('gpu_ownership_events')
