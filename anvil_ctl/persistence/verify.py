"""`audit verify`: walk the chain, re-digest the rows it covers, compare the head.

What is checked, and what each check catches:

- the chain: ids without gaps, each entry linked to the one before and hashing to
  its own hash (an entry edited, deleted, inserted or reordered);
- every covered row (`coverage`): its digest recomputed from its table equals the
  digest its entry recorded (a row edited, or replaced), every covered row is
  still there (deleted), and every row of a history table is covered (inserted
  outside anvilctl);
- the head: the entry the head file names (and `--expect-head`, when given) is
  there with the recorded hash (the tail cut off, the journal rewritten and
  rehashed);
- the append-only triggers are all in place and enabled;
- (full walks only) the current-state projection (`projection`) against a rebuild
  from history: it is derived and not covered by the chain, so a table that differs
  is named in `projection_differs` (a write outside anvilctl, or history rewritten
  under it) without being a problem of the record itself, which the checks above judge.

A full walk reads everything. An incremental one starts at the latest checkpoint
(a position a clean verify recorded, with each covered table's row count then):
entry `seq` must still have its hash, the entries after it are walked and the
rows they cover re-digested, and each table must hold its checkpointed count
plus what those entries cover. On SQLite a schema change since the checkpoint
(a trigger dropped, even if put back) makes it walk everything, since rows
covered before the checkpoint could then have been rewritten; any problem found
does too, so that the report names each row. What an incremental run cannot
see is an old row rewritten without a trace in the schema (a hand-edited file,
PostgreSQL's `session_replication_role`): `--full` does, and is cheap enough for
a daily timer. A clean run records its checkpoint (a covered row, so that a
checkpoint cannot be slipped in: the one a run starts from must be covered by
an entry after its position).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Table, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import Unavailable
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import audit, chainwalk, projection
from anvil_ctl.persistence.audit import Head
from anvil_ctl.persistence.chainwalk import BATCH, Problem, Refs, Walk
from anvil_ctl.persistence.coverage import COVERED, RowKey, RowValues, key_of, row_digest
from anvil_ctl.persistence.ddl import expected_triggers
from anvil_ctl.persistence.head import HeadFileError, read_head
from anvil_ctl.persistence.models import AuditCheckpoint, AuditEntry
from anvil_ctl.persistence.store import Store, utcnow
from anvil_ctl.persistence.verify_report import (  # re-exported: the report is verify's answer
    CheckpointRecord,
    HeadFileCheck,
    HostEntries,
    Report,
    ReportRecord,
)

__all__ = ["CheckpointRecord", "HeadFileCheck", "Report", "ReportRecord", "verify"]

log = get_logger(__name__)

AUDIT_TABLE = AuditEntry.__tablename__


# -- the rows ----------------------------------------------------------------------------------


def _edited(recorded: bytes, table: Table, values: RowValues) -> bool:
    """Whether the row's SHA-256 does not start with the digest its entry recorded."""
    return not bytes.fromhex(row_digest(table, values)).startswith(recorded)


def _check_all_rows(s: Session, walk: Walk, report: Report) -> None:
    """Every row of every covered table against the refs of the whole chain."""
    for name, table in COVERED.items():
        refs = walk.refs.pop(name, None) or Refs()
        count = 0
        for values in s.execute(select(table).execution_options(yield_per=BATCH)).mappings():
            count += 1
            key = key_of(table, values)
            ref = refs.pop(key)
            if ref is None:
                report.problems.append(
                    Problem("row not covered by the journal (inserted outside anvilctl)", None, name, key)
                )
            elif _edited(ref[0], table, values):
                report.problems.append(
                    Problem("content edited: row digest differs from its journal entry", ref[1], name, key)
                )
        for key, entry in refs.items():
            report.problems.append(
                Problem("row deleted: covered by the journal, gone from its table", entry, name, key)
            )
        report.counts[name] = count
        report.rows_checked += count


def _chunks(keys: list[RowKey]) -> Iterator[list[RowKey]]:
    for i in range(0, len(keys), 500):
        yield keys[i : i + 500]


def _check_new_rows(s: Session, walk: Walk, report: Report) -> None:
    """The rows the walked entries cover, looked up by key."""
    for name, refs in walk.refs.items():
        table = COVERED[name]
        (pk,) = table.primary_key.columns
        wanted = [key for key, _entry in refs.items()]
        for chunk in _chunks(wanted):
            for values in s.execute(select(table).where(pk.in_(chunk))).mappings():
                key = key_of(table, values)
                ref = refs.pop(key)
                if ref is None:
                    continue
                report.rows_checked += 1
                if _edited(ref[0], table, values):
                    report.problems.append(
                        Problem(
                            "content edited: row digest differs from its journal entry", ref[1], name, key
                        )
                    )
        for key, entry in refs.items():
            report.problems.append(
                Problem("row deleted: covered by the journal, gone from its table", entry, name, key)
            )


def _table_counts(s: Session) -> dict[str, int]:
    return {
        name: int(s.execute(select(func.count()).select_from(t)).scalar_one()) for name, t in COVERED.items()
    }


# -- schema and head ---------------------------------------------------------------------------


def _schema_version(s: Session) -> int | None:
    if s.get_bind().dialect.name != "sqlite":
        return None
    return int(s.execute(text("PRAGMA schema_version")).scalar_one())


def _check_triggers(s: Session, problems: list[Problem]) -> bool:
    """Name each append-only trigger that is missing or disabled; True if all are in place."""
    dialect = s.get_bind().dialect.name
    expected = expected_triggers(dialect, (*COVERED, AUDIT_TABLE))
    if dialect == "sqlite":
        rows = s.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
        present = {r[0]: "O" for r in rows}
    elif dialect == "postgresql":
        rows = s.execute(text("SELECT tgname, tgenabled FROM pg_trigger WHERE NOT tgisinternal"))
        present = {r[0]: r[1] for r in rows}
    else:
        return True
    before = len(problems)
    for name, table in sorted(expected.items()):
        if name not in present:
            problems.append(Problem(f"append-only trigger {name} is missing (dropped)", None, table))
        elif present[name] == "D":
            problems.append(Problem(f"append-only trigger {name} is disabled", None, table))
    return len(problems) == before


def _check_pinned(s: Session, end: Head, pinned: Head, what: str, problems: list[Problem]) -> None:
    if pinned.seq > end.seq:
        problems.append(
            Problem(
                f"tail cut: the journal ends at entry {end.seq} but {what} records entry {pinned.seq}: "
                f"entries {end.seq + 1}..{pinned.seq} are gone",
                pinned.seq,
            )
        )
        return
    held = audit.hash_at(s, pinned.seq)
    if held is None:
        problems.append(Problem(f"entry {pinned.seq}, recorded by {what}, is missing", pinned.seq))
    elif held != pinned.hash:
        problems.append(
            Problem(
                f"journal rewritten: entry {pinned.seq} has hash {held[:16]}…, {what} records "
                f"{pinned.hash[:16]}…",
                pinned.seq,
            )
        )


def _check_head_file(s: Session, path: Path | None, report: Report) -> None:
    if path is None:
        report.head_file = {"path": None}
        return
    report.head_file = {"path": str(path)}
    try:
        recorded = read_head(path)
    except HeadFileError as exc:
        report.problems.append(Problem(f"head file: {exc}"))
        return
    if recorded is None:
        if report.head.seq:
            report.problems.append(
                Problem(
                    f"head file {path} is missing: a cut tail cannot be told from an intact one "
                    "(restore it, or pass --expect-head SEQ:HASH)"
                )
            )
        return
    report.head_file["head"] = str(recorded)
    report.head_file["behind"] = max(0, report.head.seq - recorded.seq)
    _check_pinned(s, report.head, recorded, f"the head file {path}", report.problems)


# -- verify ------------------------------------------------------------------------------------


def _latest_checkpoint(s: Session) -> AuditCheckpoint | None:
    return s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id.desc()).limit(1)).scalar()


def _checkpoint_dict(cp: AuditCheckpoint) -> CheckpointRecord:
    return {"id": cp.id, "head": f"{cp.seq}:{cp.hash}", "mode": cp.mode, "at": cp.at}


def _full(s: Session, report: Report) -> None:
    pins = {cp.seq: (cp.id, cp.hash) for cp in s.execute(select(AuditCheckpoint)).scalars()}
    walk = chainwalk.walk(s, audit.EMPTY, report.problems, {seq: h for seq, (_id, h) in pins.items()})
    report.entries_checked = walk.entries
    report.head = walk.end
    for seq, (cp_id, cp_hash) in sorted(pins.items()):
        if seq > walk.end.seq:
            _check_pinned(s, walk.end, Head(seq, cp_hash), f"checkpoint {cp_id}", report.problems)
    _check_all_rows(s, walk, report)
    report.projection_differs = projection.compare(s)
    if report.projection_differs:
        log.warning("audit.projection_differs", tables=report.projection_differs)


def _incremental(s: Session, cp: AuditCheckpoint, report: Report) -> str | None:
    """Check what came after checkpoint `cp`; return why a full walk is needed, or None."""
    report.started_from = _checkpoint_dict(cp)
    if report.schema_version is not None and cp.schema_version != report.schema_version:
        return f"the schema changed since checkpoint {cp.id}"
    if audit.hash_at(s, cp.seq) != cp.hash:
        return f"entry {cp.seq} no longer has the hash checkpoint {cp.id} recorded"
    walk = chainwalk.walk(s, Head(cp.seq, cp.hash), report.problems, {})
    own = walk.refs.get(AuditCheckpoint.__tablename__)
    if own is None or cp.id not in own:
        return f"checkpoint {cp.id} is not covered by an entry after its position"
    report.entries_checked, report.head = walk.entries, walk.end
    added = {name: len(refs) for name, refs in walk.refs.items()}
    _check_new_rows(s, walk, report)
    if report.problems:
        return "the entries after the checkpoint have problems"
    before = json.loads(cp.counts_json)
    counts = _table_counts(s)
    for name, count in counts.items():
        if count != before.get(name, 0) + added.get(name, 0):
            return f"{name} holds {count} rows, not what checkpoint {cp.id} and the entries after it cover"
    report.counts = counts
    return None


@contextmanager
def _snapshot(store: Store) -> Iterator[Session]:
    """One read transaction for the whole walk: counts and chain describe the same moment."""
    with store.read() as s:
        if s.get_bind().dialect.name == "postgresql":
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        yield s


def verify(store: Store, *, full: bool = False, expect_head: Head | None = None) -> Report:
    """Verify the record (see the module doc); a clean run records a checkpoint."""
    report = Report(mode="full" if full else "incremental", expect_head=expect_head)
    with _snapshot(store) as s:
        report.schema_version = _schema_version(s)
        trigger_problems: list[Problem] = []
        triggers_ok = _check_triggers(s, trigger_problems)
        if not full:
            cp = _latest_checkpoint(s)
            if cp is None:
                report.escalated = "no checkpoint yet"
            elif not triggers_ok:
                report.escalated = "append-only triggers are missing or disabled"
            else:
                report.escalated = _incremental(s, cp, report)
        if full or report.escalated is not None:
            report.problems, report.counts = [], {}
            report.entries_checked = report.rows_checked = 0
            _full(s, report)
        report.problems[:0] = trigger_problems
        _check_head_file(s, store.head_path, report)
        if expect_head is not None:
            _check_pinned(s, report.head, expect_head, "--expect-head", report.problems)
    if report.ok:
        try:
            report.checkpoint = _record_checkpoint(store, report)
        except OperationalError as exc:  # a read-only copy verifies all the same
            report.checkpoint_error = str(exc.orig)
            log.warning("audit.checkpoint_unrecorded", error=report.checkpoint_error)
        except Unavailable as exc:  # the store's edge translated it: read-only, busy or full
            report.checkpoint_error = str(getattr(exc.__cause__, "orig", None) or exc)
            log.warning("audit.checkpoint_unrecorded", error=report.checkpoint_error)
    return report


CHECKPOINT_BUSY_MS = 200
"""A checkpoint only saves later work: when another writer holds the database, skip it."""


def _record_checkpoint(store: Store, report: Report) -> CheckpointRecord:
    with store.write(busy_ms=CHECKPOINT_BUSY_MS) as s:
        row = AuditCheckpoint(
            seq=report.head.seq,
            hash=report.head.hash,
            schema_version=report.schema_version,
            counts_json=canonical_json(report.counts),
            mode=report.mode if not report.escalated else "full",
            entries_checked=report.entries_checked,
            rows_checked=report.rows_checked,
            at=utcnow(),
        )
        s.add(row)
        store.audit(
            s,
            "audit.checkpoint",
            None,
            {"head": str(report.head), "mode": row.mode, "rows_checked": report.rows_checked},
        )
        s.flush()
        return _checkpoint_dict(row)


def host_counts(store: Store, host: int | None) -> list[HostEntries]:
    """Per host (`host`, or every registered host when None): its name and how many journal
    entries it wrote; the report's `hosts`. The chain itself is one for the whole fleet."""
    sql = (
        "SELECT h.id, h.name, (SELECT count(*) FROM audit_journal a WHERE a.host_id = h.id) AS entries "
        "FROM hosts h"
    )
    params: dict[str, int] = {}
    if host is not None:
        sql += " WHERE h.id = :host"
        params["host"] = host
    sql += " ORDER BY h.id"
    with store.read() as s:
        return [
            {"host": str(r.name), "host_id": int(r.id), "entries": int(r.entries)}
            for r in s.execute(text(sql), params)
        ]
