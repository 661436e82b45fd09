"""Serve identities as recorded (`identities`) and as current (`identity_current`), per host.

A body is stored once per content in `identity_bodies`, keyed by the identity's digest. These
functions work inside the caller's session; the Store appends the covering audit entry.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.current_models import IdentityCurrent
from anvil_ctl.persistence.models import IdentityBody, IdentityRow


def record(s: Session, tx_id: str | None, role: str, identity: Identity, now: str) -> int:
    """Append the identity row (and its body when the content is new); its id. The caller's
    write transaction audits it."""
    digest = identity.digest
    if s.get(IdentityBody, digest) is None:
        s.add(IdentityBody(digest=digest, body_json=canonical_json(identity.as_dict()), at=now))
    row = IdentityRow(
        tx_id=tx_id,
        slot=identity.slot,
        role=role,
        digest=digest,
        container_id=identity.container_id,
        image_id=identity.image_id,
        served_model=identity.served_model,
        at=now,
    )
    s.add(row)
    s.flush()
    projection.on_identity(s, row)
    return row.id


def _first(s: Session, q: Select[str]) -> Identity | None:
    """The identity whose digest `q` selects first, None if it selects none."""
    digest = s.execute(q.limit(1)).scalar()
    if digest is None:
        return None
    body = s.get(IdentityBody, digest)
    if body is None:
        raise StateStoreError(f"identity body {digest} is missing from identity_bodies")
    return Identity.from_json(body.body_json)


def current(s: Session, host: int, slot: str, role: str) -> Identity | None:
    """Host `host`'s latest identity of (slot, role), from the projection."""
    return _first(
        s,
        select(IdentityCurrent.digest).where(
            IdentityCurrent.host_id == host, IdentityCurrent.slot == slot, IdentityCurrent.role == role
        ),
    )


def of_transaction(s: Session, tx_id: str, role: str) -> Identity | None:
    """The identity transaction `tx_id` recorded last in `role` (through `ix_identities_tx_id`)."""
    return _first(
        s,
        select(IdentityRow.digest)
        .where(IdentityRow.tx_id == tx_id, IdentityRow.role == role)
        .order_by(IdentityRow.id.desc()),
    )


def by_ref(s: Session, host: int, slot: str, ref: str) -> Identity | None:
    """Host `host`'s newest identity of `slot` (any role) whose container ID or digest starts
    with `ref`, or whose served model is `ref`."""

    # Newest first by key, stopping at the first match, the match tested in SQL: the identities
    # recorded since it, not all of them. The slot is compared as `slot || ''`, which no index
    # serves: through ix_identities_slot_role_id SQLite would read every identity of the slot
    # and sort them before the first row.
    def starts(column: InstrumentedAttribute[str]) -> ColumnElement[bool]:
        return func.substr(column, 1, len(ref)) == ref  # exactly, not as a LIKE pattern

    return _first(
        s,
        select(IdentityRow.digest)
        .where(IdentityRow.slot.concat("") == slot, IdentityRow.host_id == host)
        .where(
            or_(starts(IdentityRow.container_id), starts(IdentityRow.digest), IdentityRow.served_model == ref)
        )
        .order_by(IdentityRow.id.desc()),
    )
