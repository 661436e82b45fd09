"""Recheck results: the read-only goal-closure assertions cron runs, one row per run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypedDict, cast

from sqlalchemy import select

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence.models import RecheckRow
from anvil_ctl.persistence.store import Store, utcnow


class RecheckRecord(TypedDict):
    """One recorded run as `rechecks()` returns it (`failed`: the failed assertions' names)."""

    id: int
    slot: str
    passed: bool
    failed: list[str]
    snapshot_sha256: str
    at: str


def record_recheck(
    store: Store,
    *,
    slot: str,
    passed: bool,
    failed: Sequence[str],
    assertions: Sequence[JSONObject],
    snapshot_sha256: str,
) -> int:
    """Record one run; return its row ID."""
    with store.write() as s:
        row = RecheckRow(
            slot=slot,
            passed=int(passed),
            failed_json=canonical_json(list(failed)),
            assertions_json=canonical_json(list(assertions)),
            snapshot_sha256=snapshot_sha256,
            at=utcnow(),
        )
        s.add(row)
        s.flush()
        store.audit(s, "recheck", None, {"slot": slot, "passed": passed, "failed": list(failed)})
        return row.id


def rechecks(store: Store, *, slot: str | None = None, limit: int = 50) -> list[RecheckRecord]:
    """The newest `limit` runs, newest first, optionally of one slot."""
    r = RecheckRow
    q = (
        select(r.id, r.slot, r.passed, r.failed_json.label("failed"), r.snapshot_sha256, r.at)
        .where(r.host_id == store.host)  # ix_rechecks_host_id_id
        .order_by(r.id.desc())
        .limit(limit)
    )
    if slot:
        q = q.where(r.slot == slot)
    with store.read() as s:
        return [
            cast(RecheckRecord, {**m, "passed": bool(m["passed"]), "failed": json.loads(m["failed"])})
            for m in s.execute(q).mappings()
        ]
