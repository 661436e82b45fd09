"""spine: transactions, steps, snapshots, identities, locks, audit

Revision ID: 0001
Revises:
Create Date: 2026-11-29 21:45:55.044191
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from anvil_ctl.persistence.ddl import drop_append_only, make_append_only
from anvil_ctl.persistence.models import APPEND_ONLY_TABLES


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_journal',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('event', sa.String(length=64), nullable=False),
    sa.Column('payload_json', sa.Text(), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('hash')
    )
    with op.batch_alter_table('audit_journal', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_journal_tx_id'), ['tx_id'], unique=False)

    op.create_table('locks',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('boot_id', sa.String(length=64), nullable=False),
    sa.Column('command', sa.String(length=64), nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('since', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('transactions',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('slot', sa.String(length=64), nullable=True),
    sa.Column('args_json', sa.Text(), nullable=False),
    sa.Column('owner_pid', sa.Integer(), nullable=False),
    sa.Column('owner_host', sa.String(length=255), nullable=False),
    sa.Column('owner_boot_id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('transactions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_transactions_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_transactions_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_transactions_slot'), ['slot'], unique=False)

    op.create_table('identities',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('slot', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('container_id', sa.String(length=64), nullable=False),
    sa.Column('image_id', sa.String(length=80), nullable=False),
    sa.Column('served_model', sa.String(length=255), nullable=False),
    sa.Column('body_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('identities', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_identities_container_id'), ['container_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_identities_digest'), ['digest'], unique=False)
        batch_op.create_index('ix_identities_slot_role_id', ['slot', 'role', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_identities_tx_id'), ['tx_id'], unique=False)

    op.create_table('lock_releases',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('lock_id', sa.String(length=36), nullable=False),
    sa.Column('how', sa.String(length=16), nullable=False),
    sa.Column('by', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['lock_id'], ['locks.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('lock_id')
    )
    op.create_table('snapshot_diffs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=False),
    sa.Column('label', sa.String(length=32), nullable=False),
    sa.Column('before_sha256', sa.String(length=64), nullable=False),
    sa.Column('after_sha256', sa.String(length=64), nullable=False),
    sa.Column('equal', sa.Integer(), nullable=False),
    sa.Column('changes_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('snapshot_diffs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_snapshot_diffs_tx_id'), ['tx_id'], unique=False)

    op.create_table('snapshots',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=True),
    sa.Column('label', sa.String(length=32), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('body_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_snapshots_sha256'), ['sha256'], unique=False)
        batch_op.create_index(batch_op.f('ix_snapshots_tx_id'), ['tx_id'], unique=False)

    op.create_table('step_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('step', sa.String(length=64), nullable=False),
    sa.Column('phase', sa.String(length=8), nullable=False),
    sa.Column('event', sa.String(length=16), nullable=False),
    sa.Column('detail_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('step_events', schema=None) as batch_op:
        batch_op.create_index('ix_step_events_tx_id_id', ['tx_id', 'id'], unique=False)

    op.create_table('transaction_states',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tx_id', sa.String(length=36), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('data_json', sa.Text(), nullable=False),
    sa.Column('at', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['tx_id'], ['transactions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('transaction_states', schema=None) as batch_op:
        batch_op.create_index('ix_transaction_states_tx_id_id', ['tx_id', 'id'], unique=False)


    for table in APPEND_ONLY_TABLES:
        make_append_only(table)
    op.execute(
        """
        CREATE VIEW v_transactions AS
        SELECT t.id AS tx_id, t.kind, t.slot, t.created_at,
               (SELECT s.state FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS state,
               (SELECT s.reason FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS reason,
               (SELECT s.at FROM transaction_states s WHERE s.tx_id = t.id
                ORDER BY s.id DESC LIMIT 1) AS updated_at,
               t.owner_host, t.owner_pid
        FROM transactions t
        """
    )
    op.execute(
        """
        CREATE VIEW v_steps AS
        SELECT e.tx_id, e.seq, e.step, e.phase, e.event, e.at, e.detail_json
        FROM step_events e
        """
    )
    op.execute(
        """
        CREATE VIEW v_identities AS
        SELECT i.id, i.slot, i.role, i.container_id, i.image_id, i.served_model,
               i.digest, i.tx_id, i.at AS recorded_at
        FROM identities i
        """
    )

def downgrade() -> None:
    for view in ("v_identities", "v_steps", "v_transactions"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    for table in APPEND_ONLY_TABLES:
        drop_append_only(table)
    with op.batch_alter_table('transaction_states', schema=None) as batch_op:
        batch_op.drop_index('ix_transaction_states_tx_id_id')

    op.drop_table('transaction_states')
    with op.batch_alter_table('step_events', schema=None) as batch_op:
        batch_op.drop_index('ix_step_events_tx_id_id')

    op.drop_table('step_events')
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_snapshots_tx_id'))
        batch_op.drop_index(batch_op.f('ix_snapshots_sha256'))

    op.drop_table('snapshots')
    with op.batch_alter_table('snapshot_diffs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_snapshot_diffs_tx_id'))

    op.drop_table('snapshot_diffs')
    op.drop_table('lock_releases')
    with op.batch_alter_table('identities', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_identities_tx_id'))
        batch_op.drop_index('ix_identities_slot_role_id')
        batch_op.drop_index(batch_op.f('ix_identities_digest'))
        batch_op.drop_index(batch_op.f('ix_identities_container_id'))

    op.drop_table('identities')
    with op.batch_alter_table('transactions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_transactions_slot'))
        batch_op.drop_index(batch_op.f('ix_transactions_kind'))
        batch_op.drop_index(batch_op.f('ix_transactions_created_at'))

    op.drop_table('transactions')
    op.drop_table('locks')
    with op.batch_alter_table('audit_journal', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_journal_tx_id'))

    op.drop_table('audit_journal')
