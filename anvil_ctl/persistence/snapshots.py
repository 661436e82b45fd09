"""Reading recorded snapshots (the Store records them): bodies, and what a serve served.

Each `snapshots` row names its blob (`snapshot_blobs`, keyed by SHA-256), stored once per content.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.snapshot import Snapshot
from anvil_ctl.persistence.models import SnapshotBlob, SnapshotRow, Transaction
from anvil_ctl.persistence.store import Store


def _newest_first(s: Session, slot: str, host: int) -> Iterator[tuple[int, str]]:
    """(id, sha256) of the slot's snapshots, newest first by key, in pages growing from 8 to 256.

    The slot is compared as `slot || ''` so that no index on the slot draws the planner into
    reading all its snapshots before the first page."""
    # `below` starts above every key: the largest INTEGER (PostgreSQL refuses a larger parameter)
    size, below = 8, 2**31 - 1
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


def served_snapshot(store: Store, target: Identity) -> tuple[str, JSONObject] | None:
    """The SHA-256 and body of this host's newest recorded snapshot in which `target` served its
    slot: recorded as its incumbent, its container running and the binding serving its model."""
    seen: set[str] = set()
    with store.read() as s:
        for _, sha in _newest_first(s, target.slot, store.host):  # stops at the first that qualifies
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


def body_by_sha256(store: Store, sha256: str) -> JSONObject | None:
    """A recorded snapshot's body by its SHA-256, None if the record holds no such body."""
    with store.read() as s:
        blob = s.get(SnapshotBlob, sha256)
    value: JSONValue = json.loads(blob.body_json) if blob is not None else None
    return value if isinstance(value, dict) else None


def of_transaction(store: Store, tx_id: str) -> dict[str, Snapshot]:
    """A transaction's snapshots by label (before, after, ...)."""
    q = select(SnapshotRow).where(SnapshotRow.tx_id == tx_id).order_by(SnapshotRow.id)
    with store.read() as s:
        return {r.label: Snapshot(json.loads(_blob(s, r.sha256))) for r in s.execute(q).scalars()}


def _object(value: object) -> Mapping[str, object]:
    """A snapshot member that should be an object; {} when it is absent, null or not one."""
    return value if isinstance(value, dict) else {}


def _blob(s: Session, sha256: str) -> str:
    """A snapshot body by its content hash (`snapshot_blobs`)."""
    blob = s.get(SnapshotBlob, sha256)
    if blob is None:
        raise StateStoreError(f"snapshot body {sha256[:12]} is missing from snapshot_blobs")
    return blob.body_json
