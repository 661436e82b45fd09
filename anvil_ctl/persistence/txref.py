"""A step row's reference to its transaction (migration 0016 on): an integer, not the ID.

A transaction's ID is 36 characters of text, and its dozen step rows repeated it, each
once more in `ix_step_events_tx_id_id` (random IDs, so that index filled its pages half
way). From migration 0016 on a step row names its transaction by `tx_ref`: the integer key
of the transaction's first state row (`planned`, written with the transaction), which
names the transaction by its ID. A row's digest covers its `tx_ref` and the state row's
digest its `tx_id`, so a step moved to another transaction, or a state row renamed, does
not verify. Rows written before name the transaction by `tx_id`, as they always did, and
both are found: each form has its own partial index, and `v_steps` shows the ID either way.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from anvil_ctl.persistence.models import StepEventRow, TransactionState


def first_state(s: Session, tx_id: str) -> int | None:
    """The key of the transaction's first state row (what its steps name), None if none."""
    return s.execute(select(func.min(TransactionState.id)).where(TransactionState.tx_id == tx_id)).scalar()


def step_rows(s: Session, tx_id: str) -> list[StepEventRow]:
    """The transaction's step rows in the order they were written, of either form."""
    rows = list(
        s.execute(select(StepEventRow).where(StepEventRow.tx_id == tx_id).order_by(StepEventRow.id)).scalars()
    )
    ref = first_state(s, tx_id)
    if ref is not None:
        rows += s.execute(
            select(StepEventRow).where(StepEventRow.tx_ref == ref).order_by(StepEventRow.id)
        ).scalars()
    return sorted(rows, key=lambda r: r.id)
