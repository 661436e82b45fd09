"""The hash-chained audit journal.

Each row's hash is SHA-256 over the previous row's hash and the row's canonical
content (id, time, transaction, event, payload). Editing a row breaks its own
hash; deleting or reordering rows breaks the chain's links; `verify_chain` says
which row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from anvil_ctl.core.model import canonical_json, sha256_hex
from anvil_ctl.persistence.models import AuditEntry

GENESIS = "0" * 64
AUDIT_LOCK_KEY = 0x616E76696C  # "anvil"


def entry_hash(prev_hash: str, row_id: int, *, at: str, tx_id: str | None, event: str, payload: str) -> str:
    return sha256_hex(
        prev_hash
        + "|"
        + canonical_json({"id": row_id, "at": at, "tx_id": tx_id, "event": event, "payload": payload})
    )


def append(session: Session, *, at: str, tx_id: str | None, event: str, payload: dict[str, Any]) -> None:
    """Append one entry; the caller's write transaction serializes appenders.

    SQLite writers are serialized by BEGIN IMMEDIATE; on PostgreSQL a transaction-scoped
    advisory lock does it, so two hosts sharing one database never fork the chain.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
    last = session.execute(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(1)).scalar()
    prev_hash = last.hash if last else GENESIS
    row_id = (last.id + 1) if last else 1
    body = canonical_json(payload)
    session.add(
        AuditEntry(
            id=row_id,
            at=at,
            tx_id=tx_id,
            event=event,
            payload_json=body,
            prev_hash=prev_hash,
            hash=entry_hash(prev_hash, row_id, at=at, tx_id=tx_id, event=event, payload=body),
        )
    )


@dataclass(frozen=True)
class ChainProblem:
    row_id: int
    problem: str

    def as_dict(self) -> dict[str, Any]:
        return {"row_id": self.row_id, "problem": self.problem}


def verify_chain(session: Session) -> tuple[int, list[ChainProblem]]:
    """Walk the chain in id order; return (rows checked, problems)."""
    problems: list[ChainProblem] = []
    prev_hash = GENESIS
    expected_id = 1
    count = 0
    for row in session.execute(select(AuditEntry).order_by(AuditEntry.id)).scalars():
        count += 1
        if row.id != expected_id:
            problems.append(ChainProblem(row.id, f"row(s) {expected_id}..{row.id - 1} missing (deleted)"))
        if row.prev_hash != prev_hash:
            problems.append(
                ChainProblem(
                    row.id,
                    "link broken: prev_hash does not match the row before it "
                    "(a row was deleted, inserted or reordered)",
                )
            )
        recomputed = entry_hash(
            row.prev_hash, row.id, at=row.at, tx_id=row.tx_id, event=row.event, payload=row.payload_json
        )
        if recomputed != row.hash:
            problems.append(ChainProblem(row.id, "content edited: hash does not match the row"))
        try:
            json.loads(row.payload_json)
        except ValueError:
            problems.append(ChainProblem(row.id, "payload is not JSON"))
        prev_hash = row.hash
        expected_id = row.id + 1
    return count, problems
