"""Serve identities as recorded (`identities`, history) and as current (`identity_current`):
the Store's identity records, for one host of the fleet."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from anvil_ctl.core.model import Identity, canonical_json
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.models import IdentityCurrent, IdentityRow
from anvil_ctl.persistence.scope import on_host


def record(s: Session, tx_id: str | None, role: str, identity: Identity, now: str) -> int:
    """Append the identity row (the caller's write transaction audits it); its id."""
    row = IdentityRow(
        tx_id=tx_id,
        slot=identity.slot,
        role=role,
        digest=identity.digest,
        container_id=identity.container_id,
        image_id=identity.image_id,
        served_model=identity.served_model,
        body_json=canonical_json(identity.as_dict()),
        at=now,
    )
    s.add(row)
    s.flush()
    projection.on_identity(s, row)
    return row.id


def current(s: Session, host: int, slot: str, role: str) -> Identity | None:
    """Host `host`'s latest identity of (slot, role), from the projection."""
    row = s.execute(
        select(IdentityRow.body_json)
        .join(IdentityCurrent, IdentityCurrent.identity_id == IdentityRow.id)
        .where(IdentityCurrent.host_id == host, IdentityCurrent.slot == slot, IdentityCurrent.role == role)
    ).scalar()
    return Identity.from_dict(json.loads(row)) if row else None


def by_ref(s: Session, host: int, slot: str, ref: str) -> Identity | None:
    """Host `host`'s newest identity of `slot` (any role) whose container ID or digest starts
    with `ref`, or whose served model is `ref`."""
    rows = s.execute(
        select(IdentityRow)
        .where(IdentityRow.slot == slot, on_host(IdentityRow.host_id, host))
        .order_by(IdentityRow.id.desc())
    ).scalars()
    for r in rows:
        if r.container_id.startswith(ref) or r.digest.startswith(ref) or r.served_model == ref:
            return Identity.from_dict(json.loads(r.body_json))
    return None
