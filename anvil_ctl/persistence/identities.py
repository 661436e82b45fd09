"""Identities in the state database: each body stored once per distinct content.

A serve's identity is recorded often (the candidate a load starts, the same serve as
incumbent when promoted, as rollback identity, as harbour) and its body rarely changes:
the body is stored once in `identity_bodies`, keyed by the identity's digest (the SHA-256
of the body), and each `identities` row names it by that digest with an empty
`body_json` (rows written before migration 0010 hold the body themselves). These
functions work inside the caller's session; the Store appends the covering audit entry.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.model import Identity, canonical_json
from anvil_ctl.persistence.models import IdentityBody, IdentityRow


def record(s: Session, tx_id: str | None, role: str, identity: Identity, now: str) -> IdentityRow:
    """Add an `identities` row (and its body when the content is new); flushed."""
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
        body_json="",
        at=now,
    )
    s.add(row)
    s.flush()
    return row


def body(s: Session, body_json: str, digest: str) -> str:
    """The body of an `identities` row: its own (before 0010), else its digest's."""
    if body_json:
        return body_json
    stored = s.execute(select(IdentityBody.body_json).where(IdentityBody.digest == digest)).scalar()
    if stored is None:
        raise StateStoreError(f"identity body {digest} is missing from identity_bodies")
    return stored
