"""Serve identities as recorded (`identities`, history) and as current (`identity_current`),
for one host of the fleet; each body stored once per distinct content.

A serve's identity is recorded often (the candidate a load starts, the same serve as
incumbent when promoted, as rollback identity, as harbour) and its body rarely changes:
the body is stored once in `identity_bodies`, keyed by the identity's digest (the SHA-256
of the body), and each `identities` row names it by that digest with an empty
`body_json` (rows written before migration 0010 hold the body themselves). These
functions work inside the caller's session; the Store appends the covering audit entry.
"""

from __future__ import annotations

import json

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.persistence import projection
from anvil_ctl.persistence.coltypes import starts_with_hex
from anvil_ctl.persistence.models import IdentityBody, IdentityCurrent, IdentityRow
from anvil_ctl.persistence.scope import on_host


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
        body_json="",
        at=now,
    )
    s.add(row)
    s.flush()
    projection.on_identity(s, row)
    return row.id


def body(s: Session, body_json: str, digest: str) -> str:
    """The body of an `identities` row: its own (before 0010), else its digest's."""
    if body_json:
        return body_json
    stored = s.execute(select(IdentityBody.body_json).where(IdentityBody.digest == digest)).scalar()
    if stored is None:
        raise StateStoreError(f"identity body {digest} is missing from identity_bodies")
    return stored


def current(s: Session, host: int, slot: str, role: str) -> Identity | None:
    """Host `host`'s latest identity of (slot, role), from the projection."""
    row = s.execute(
        select(IdentityRow.body_json, IdentityRow.digest)
        .join(IdentityCurrent, IdentityCurrent.identity_id == IdentityRow.id)
        .where(IdentityCurrent.host_id == host, IdentityCurrent.slot == slot, IdentityCurrent.role == role)
    ).first()
    if row is None:
        return None
    return Identity.from_dict(json.loads(body(s, row.body_json, row.digest)))


def of_transaction(s: Session, tx_id: str, role: str) -> Identity | None:
    """The identity transaction `tx_id` recorded last in `role` (through `ix_identities_tx_id`)."""
    row = s.execute(
        select(IdentityRow.body_json, IdentityRow.digest)
        .where(IdentityRow.tx_id == tx_id, IdentityRow.role == role)
        .order_by(IdentityRow.id.desc())
        .limit(1)
    ).first()
    return None if row is None else Identity.from_dict(json.loads(body(s, row.body_json, row.digest)))


def by_ref(s: Session, host: int, slot: str, ref: str) -> Identity | None:
    """Host `host`'s newest identity of `slot` (any role) whose container ID or digest starts
    with `ref`, or whose served model is `ref`."""

    # Newest first by key, stopping at the first match, the match tested by SQLite: the
    # identities recorded since it, not all of them (in pages tested here, a walk back to an old
    # container or past every identity for a REF naming none was 0.45 s at 100k transactions).
    # The slot is compared as `slot || ''`, which no index serves: through
    # ix_identities_slot_role_id SQLite read every identity of the slot and sorted them before
    # the first row: 9.8 s for `rollback --to` at 100k transactions.
    dialect = s.get_bind().dialect.name
    row = s.execute(
        select(IdentityRow.body_json, IdentityRow.digest)
        .where(IdentityRow.slot.concat("") == slot, on_host(IdentityRow.host_id, host))
        .where(
            or_(
                starts_with_hex(IdentityRow.container_id, ref, dialect),
                starts_with_hex(IdentityRow.digest, ref, dialect),
                IdentityRow.served_model == ref,
            )
        )
        .order_by(IdentityRow.id.desc())
        .limit(1)
    ).first()
    return None if row is None else Identity.from_dict(json.loads(body(s, row.body_json, row.digest)))
