"""Migration 0019 drops three indexes no query used (issue 13, bytes per transaction):
`ix_transactions_kind`, `ix_transactions_slot` and `ix_decisions_identity_digest`.

After it a host's history costs fewer bytes per transaction, every record still verifies, the
lookups those columns take part in still go through an index (the digest's by
`ix_decisions_identity_digest_at`, a slot's transactions by `tx_current`), and a downgrade
gives the indexes back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command

from anvil_ctl.commands import audit
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import alembic_config
from tests.unit.fakehost import make_fake_host
from tests.unit.forge import db_file
from tests.unit.test_lean_records import _cycle

DROPPED = {
    "ix_transactions_kind": "transactions",
    "ix_transactions_slot": "transactions",
    "ix_decisions_identity_digest": "decisions",
}


def _indexes(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index'")}


def _plan(db: Path, sql: str, *params: object) -> str:
    with sqlite3.connect(db) as conn:
        return " / ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_the_unused_indexes_are_gone_and_a_downgrade_gives_them_back(tmp_path: Path) -> None:
    host = make_fake_host(tmp_path)
    _cycle(host, 1)
    db = db_file(host)
    assert not set(DROPPED) & _indexes(db)
    assert audit.verify(host.app(), full=True)["ok"]
    # what used to read them reads another index (never a scan of the history table)
    by_digest = _plan(db, "SELECT id FROM decisions WHERE identity_digest = ? ORDER BY at DESC", "d")
    assert "INDEX ix_decisions_identity_digest_at (identity_digest=?)" in by_digest, by_digest
    by_slot = _plan(db, "SELECT tx_id FROM v_transactions WHERE slot = ? AND kind = ?", "primary", "load")
    assert "SCAN" not in by_slot.replace("SCAN CONSTANT ROW", ""), by_slot
    assert "tx_current" in by_slot or "ix_tx_current" in by_slot, by_slot

    engine = make_engine(f"sqlite:///{db}")
    try:
        command.downgrade(alembic_config(engine), "0018")
        assert set(DROPPED) <= _indexes(db)
        command.upgrade(alembic_config(engine), "head")
        assert not set(DROPPED) & _indexes(db)
    finally:
        engine.dispose()
    _cycle(host, 2)
    report = audit.verify(host.app(), full=True)
    assert report["ok"] and report["projection_differs"] == []
