"""Snapshots in the state database: bodies stored once per content, diffs, and reads.

Each `snapshots` row names its blob (`snapshot_blobs`, keyed by SHA-256); a diff is a JSON Patch
with a `test` of every value it takes away. These work inside the Store's write transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.snapshot import Change, Snapshot, to_patch
from anvil_ctl.persistence.models import SnapshotBlob, SnapshotDiff, SnapshotRow, Transaction

FIRST_BOUND = 2**31 - 1
"""Above every key: the largest INTEGER, the keys' type (PostgreSQL refuses a larger parameter)."""


def _newest_first(s: Session, slot: str, host: int) -> Iterator[tuple[int, str]]:
    """(id, sha256) of the slot's snapshots, newest first by key, in pages growing from 8 to 256.

    The slot is compared as `slot || ''` so that no index on the slot draws the planner into
    reading all its snapshots before the first page."""
    size, below = 8, FIRST_BOUND
    while True:
        rows = s.execute(
            select(SnapshotRow.id, SnapshotRow.sha256)
            .join(Transaction, Transaction.id == SnapshotRow.tx_id)
            .where(Transaction.slot.concat("") == slot, Transaction.host_id == host, SnapshotRow.id < below)
            .order_by(SnapshotRow.id.desc())
            .limit(size)
        ).all()
        yield from rows
        if len(rows) < size:
            return
        below = rows[-1][0]
        size = min(size * 2, 256)


def record(s: Session, tx_id: str | None, label: str, snapshot: Snapshot, now: str) -> int:
    """Add a `snapshots` row (and its blob when the content is new); returns the row's id."""
    if s.get(SnapshotBlob, snapshot.sha256) is None:
        s.add(SnapshotBlob(sha256=snapshot.sha256, body_json=snapshot.canonical, at=now))
    row = SnapshotRow(tx_id=tx_id, label=label, sha256=snapshot.sha256, at=now)
    s.add(row)
    s.flush()
    return row.id


def record_diff(
    s: Session, tx_id: str, label: str, *, before: Snapshot, after: Snapshot, changes: list[Change], now: str
) -> None:
    s.add(
        SnapshotDiff(
            tx_id=tx_id,
            label=label,
            before_sha256=before.sha256,
            after_sha256=after.sha256,
            equal=int(not changes),
            changes_json=canonical_json(to_patch(changes)),
            at=now,
        )
    )


def stored_changes(row: SnapshotDiff) -> list[JSONObject]:
    """A diff row's JSON Patch."""
    value: JSONValue = json.loads(row.changes_json)
    if not isinstance(value, list) or not all(isinstance(op, dict) for op in value):
        raise StateStoreError(f"snapshot diff {row.id}: changes_json is not a list of objects")
    return [op for op in value if isinstance(op, dict)]


def served_snapshot(s: Session, target: Identity, host: int) -> tuple[str, JSONObject] | None:
    """The SHA-256 and body of the newest recorded snapshot in which `target` served its slot:
    recorded as its incumbent, its container running and the binding serving its model."""
    seen: set[str] = set()
    for _, sha in _newest_first(s, target.slot, host):  # stops at the first that qualifies
        if sha in seen:  # the same content again: it did not qualify the first time
            continue
        seen.add(sha)
        body: JSONValue = json.loads(_blob(s, sha))
        if not isinstance(body, dict):
            continue
        slot = _object(_object(body.get("slots")).get(target.slot))
        if _object(slot.get("incumbent")).get("container_id") != target.container_id:
            continue
        container = _object(_object(slot.get("containers")).get(target.container_id))
        served = _object(slot.get("serving")).get("models")
        # each [name, max_model_len]
        models = [m[0] for m in served if isinstance(m, list) and m] if isinstance(served, list) else []
        if container.get("status") == "running" and models == [target.served_model]:
            return sha, body
    return None


def body_by_sha256(s: Session, sha256: str) -> JSONObject | None:
    """A recorded snapshot's body by its SHA-256, None if there is none."""
    blob = s.get(SnapshotBlob, sha256)
    value: JSONValue = json.loads(blob.body_json) if blob is not None else None
    return value if isinstance(value, dict) else None


def of_transaction(s: Session, tx_id: str) -> dict[str, Snapshot]:
    """A transaction's snapshots by label (before, after, ...)."""
    rows = s.execute(select(SnapshotRow).where(SnapshotRow.tx_id == tx_id).order_by(SnapshotRow.id)).scalars()
    return {r.label: Snapshot(json.loads(_blob(s, r.sha256))) for r in rows}


def _object(value: object) -> Mapping[str, object]:
    """A snapshot member that should be an object; {} when it is absent, null or not one."""
    return value if isinstance(value, dict) else {}


def _blob(s: Session, sha256: str) -> str:
    """A snapshot body by its content hash (`snapshot_blobs`)."""
    blob = s.get(SnapshotBlob, sha256)
    if blob is None:
        raise StateStoreError(f"snapshot body {sha256[:12]} is missing from snapshot_blobs")
    return blob.body_json
