"""Snapshots in the state database: bodies stored once per content, diffs, and reads.

A snapshot's body is stored once per distinct content (`snapshot_blobs`, keyed by its
SHA-256); each `snapshots` row names its blob (rows written before migration 0007 hold
the body themselves). A diff is stored as a JSON Patch (RFC 6902) with a `test` of every
value it takes away, or, when it is exactly the diff of two snapshots whose bodies are
stored (a transaction's before and after snapshots, from migration 0011 on), as `DERIVED`:
the row keeps both hashes and `equal`, and the patch is worked out from the two covered
blobs when read (`stored_changes`), so the same evidence is not stored twice. These
functions work inside the caller's session: the Store opens the write transaction and
appends the audit entry that covers the rows added here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sqlalchemy import Select, String, select, type_coerce
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONArray, JSONObject, JSONValue
from anvil_ctl.core.snapshot import Change, Snapshot, diff, to_patch
from anvil_ctl.persistence import blobdelta
from anvil_ctl.persistence.models import SnapshotBlob, SnapshotDiff, SnapshotRow, Transaction
from anvil_ctl.persistence.pages import newest_first
from anvil_ctl.persistence.scope import on_host


def record(s: Session, tx_id: str | None, label: str, snapshot: Snapshot, now: str) -> int:
    """Add a `snapshots` row (and its blob when the content is new, as a delta against the
    transaction's earlier snapshot when that is smaller: `blobdelta`); returns the row's id."""
    if s.get(SnapshotBlob, snapshot.sha256) is None:
        body = snapshot.canonical
        base = _delta_base(s, tx_id)
        if base is not None:
            body = blobdelta.encode(body, *base) or body
        s.add(SnapshotBlob(sha256=snapshot.sha256, body_json=body, at=now))
    # body_json "" : the body is the blob with this sha256 (rows before 0007 hold it).
    row = SnapshotRow(tx_id=tx_id, label=label, sha256=snapshot.sha256, body_json="", at=now)
    s.add(row)
    s.flush()
    return row.id


def _delta_base(s: Session, tx_id: str | None) -> tuple[str, str] | None:
    """(SHA-256, text) of a body stored whole to store a new one against: the blob of the
    transaction's latest snapshot, or that blob's own base when it is a delta."""
    if tx_id is None:
        return None
    sha = s.execute(
        select(SnapshotRow.sha256).where(SnapshotRow.tx_id == tx_id).order_by(SnapshotRow.id.desc()).limit(1)
    ).scalar()
    stored = _stored(s, sha) if sha else None
    if sha is None or stored is None:
        return None
    base = blobdelta.base_of(stored)
    if base is None:
        return sha, stored
    whole = _stored(s, base)
    return (base, whole) if whole is not None and blobdelta.base_of(whole) is None else None


DERIVED = '"blobs"'
"""`changes_json` of a diff that is the JSON Patch between its two stored snapshots' bodies."""


def record_diff(
    s: Session, tx_id: str, label: str, *, before: Snapshot, after: Snapshot, changes: list[Change], now: str
) -> None:
    patch = canonical_json(to_patch(changes))
    if changes and _derivable(s, before, after, patch):
        patch = DERIVED
    s.add(
        SnapshotDiff(
            tx_id=tx_id,
            label=label,
            before_sha256=before.sha256,
            after_sha256=after.sha256,
            equal=int(not changes),
            # A JSON Patch (RFC 6902) with a `test` of every value taken away; rows
            # written before it hold {path, before, after} (see snapshot.changes_from_stored).
            changes_json=patch,
            at=now,
        )
    )


def _derivable(s: Session, before: Snapshot, after: Snapshot, patch: str) -> bool:
    """Whether `patch` is what `stored_changes` will work out from the two stored bodies."""
    for snap in (before, after):
        stored = _stored(s, snap.sha256)
        if stored is None or _whole(s, stored) != snap.canonical:
            return False
    return canonical_json(to_patch(diff(before, after))) == patch


def stored_changes(s: Session, row: SnapshotDiff) -> list[JSONObject]:
    """A diff row's JSON Patch (or the older form it was written in), as stored or derived."""
    if row.changes_json == DERIVED:
        before, after = (Snapshot(json.loads(_blob(s, sha))) for sha in (row.before_sha256, row.after_sha256))
        return to_patch(diff(before, after))
    value: JSONValue = json.loads(row.changes_json)
    if not isinstance(value, list) or not all(isinstance(op, dict) for op in value):
        raise StateStoreError(f"snapshot diff {row.id}: changes_json is not a list of objects")
    return [op for op in value if isinstance(op, dict)]


def served_snapshot(s: Session, target: Identity, host: int) -> tuple[str, JSONObject] | None:
    """The SHA-256 and body of the newest recorded snapshot in which `target` served its slot
    as incumbent.

    Serving means: recorded as the slot's incumbent, its container running, and the
    binding answering with its served model. Snapshots taken while it was stopped
    (a campaign of several loads) do not count.
    """

    # Newest first by key (`pages.newest_first`): a range of the primary key that stops at
    # the first snapshot that qualifies, however long the history is. The slot is
    # compared as `slot || ''`, which no index serves: otherwise SQLite (no statistics: we
    # never ANALYZE) reads every transaction of the slot through ix_transactions_slot, all
    # their snapshots, and sorts them (238 ms at 100k transactions, 1 ms at 1k) instead of
    # walking the snapshots' primary key (0019 dropped that index, unused since; the form
    # stays, so that no index on the slot can draw the planner off the walk). The walk costs
    # the snapshots newer than the one found, of any slot; a slot's own snapshots are the
    # newest ones when it is rolled back.
    def page(below: int, size: int) -> Select[int, str, str]:
        return (
            select(SnapshotRow.id, SnapshotRow.body_json, SnapshotRow.sha256)
            .join(Transaction, Transaction.id == SnapshotRow.tx_id)
            .where(Transaction.slot.concat("") == target.slot, on_host(Transaction.host_id, host))
            .order_by(SnapshotRow.id.desc())
            .where(SnapshotRow.id < below)
            .limit(size)
        )

    seen: set[str] = set()
    for _, body_json, sha in newest_first(s, page):
        if sha in seen:  # the same content again: it did not qualify the first time
            continue
        seen.add(sha)
        body: JSONValue = json.loads(body_json or _blob(s, sha))
        if not isinstance(body, dict):
            continue
        slot = _object(_object(body.get("slots")).get(target.slot))
        if _object(slot.get("incumbent")).get("container_id") != target.container_id:
            continue
        container = _object(_object(slot.get("containers")).get(target.container_id))
        served = _array(_object(slot.get("serving")).get("models"))
        models = [m[0] for m in served if isinstance(m, list) and m]  # [name, max_model_len]
        if container.get("status") == "running" and models == [target.served_model]:
            return sha, body
    return None


def body_by_sha256(s: Session, sha256: str) -> JSONObject | None:
    """A recorded snapshot's body by its SHA-256: its blob, or a row written before 0007."""
    stored = _stored(s, sha256)
    body = None if stored is None else _whole(s, stored)
    if body is None:
        body = s.execute(
            select(SnapshotRow.body_json)
            # a row that holds its body is from before 0007: its sha256 is text (0018 stores
            # newer ones as bytes), so the value is compared as text, not converted
            .where(type_coerce(SnapshotRow.sha256, String) == sha256, SnapshotRow.body_json != "")
            .limit(1)
        ).scalar()
    value: JSONValue = json.loads(body) if body else None
    return value if isinstance(value, dict) else None


def of_transaction(s: Session, tx_id: str) -> dict[str, Snapshot]:
    """A transaction's snapshots by label (before, after, ...)."""
    rows = s.execute(select(SnapshotRow).where(SnapshotRow.tx_id == tx_id).order_by(SnapshotRow.id)).scalars()
    return {r.label: Snapshot(json.loads(r.body_json or _blob(s, r.sha256))) for r in rows}


def _object(value: object) -> Mapping[str, object]:
    """A snapshot member that should be an object; {} when it is absent, null or not one."""
    return value if isinstance(value, dict) else {}


def _array(value: object) -> JSONArray:
    """A snapshot member that should be an array; [] when it is absent, null or not one."""
    return value if isinstance(value, list) else []


def _stored(s: Session, sha256: str) -> str | None:
    """A blob's text as stored (whole, or a delta), None if there is no such blob."""
    blob = s.get(SnapshotBlob, sha256)
    return None if blob is None else blob.body_json


def _blob(s: Session, sha256: str) -> str:
    """A snapshot body by its content hash (`snapshot_blobs`), a delta inflated."""
    body = _stored(s, sha256)
    if body is None:
        raise StateStoreError(f"snapshot body {sha256[:12]} is missing from snapshot_blobs")
    return _whole(s, body)


def _whole(s: Session, stored: str) -> str:
    def base(sha: str) -> str:
        text = _stored(s, sha)
        if text is None or blobdelta.base_of(text) is not None:
            raise StateStoreError(f"snapshot body {sha[:12]}, a delta's base, is missing or not whole")
        return text

    try:
        return blobdelta.decode(stored, base)
    except ValueError as exc:
        raise StateStoreError(str(exc)) from None
