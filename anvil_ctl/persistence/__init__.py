"""The state database: every SQL query and write of anvil_ctl lives in this package.

Callers get and give our own values (dataclasses, `Identity`, `Waiver`, JSON-able
dicts), never a session or an ORM row. One concept per module:

- `store`: the Store, the Journal port (transactions, steps, snapshots, identities)
- `audit`: the hash-chained audit journal (append, the head); `coverage`: which rows
  each entry covers and their digests; `head`: the head file outside the database;
  `chainwalk`: walking the chain; `verify`: `audit verify` (full and incremental,
  checkpoints)
- `queries`: read-only audit queries for operators
- `gpu_ledger`, `qualification`, `waivers`, `approvals`, `rechecks`, `locks`: one
  history table (or pair) each
- `models` (history), `current_models` (the projection, `projection`), `ddl`, `db`,
  `migrate`: ORM models, DDL the ORM cannot express, engines, and the alembic-owned schema
"""
