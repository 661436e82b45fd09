"""`audit verify`: walk the chain, re-digest the rows it covers, compare the head.

It checks the chain's links and hashes, every covered row's digest, presence and coverage,
the head file and `--expect-head`, the append-only triggers and (full walks) the projection
against a rebuild. Incremental runs start at the latest checkpoint and escalate to a full walk
on a schema change or any problem; a clean run records a (covered) checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Table, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import Unavailable
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import audit, chainwalk, projection
from anvil_ctl.persistence.audit import Head
from anvil_ctl.persistence.chainwalk import BATCH, Problem, Refs
from anvil_ctl.persistence.coverage import COVERED, RowValues, key_of, row_digest
from anvil_ctl.persistence.ddl import expected_triggers
from anvil_ctl.persistence.head import HeadFileError, read_head
from anvil_ctl.persistence.models import AuditCheckpoint, AuditEntry, Host
from anvil_ctl.persistence.store import Store, utcnow

log = get_logger(__name__)


@dataclass
class Report:
    """What one `audit verify` checked and found."""

    mode: str  # full | incremental
    head: Head = audit.EMPTY
    entries_checked: int = 0
    rows_checked: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    schema_version: int | None = None
    started_from: JSONObject | None = None  # the checkpoint an incremental run began at
    escalated: str | None = None  # why an incremental run walked everything
    head_file: JSONObject = field(default_factory=dict)  # path, the head it records, how far behind
    expect_head: Head | None = None
    checkpoint: JSONObject | None = None  # the checkpoint this run recorded (id, head, mode, at)
    checkpoint_error: str | None = None  # why it could not record one (a read-only database)
    problems: list[Problem] = field(default_factory=list)
    projection_differs: list[str] = field(default_factory=list)  # full walks: derived tables off

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> JSONObject:
        """As `audit verify --json` prints it (`rows` repeats `entries_checked`)."""
        return {
            "ok": self.ok,
            "mode": self.mode,
            "escalated": self.escalated,
            "rows": self.entries_checked,
            "entries_checked": self.entries_checked,
            "rows_checked": self.rows_checked,
            "entries": self.head.seq,
            "head": str(self.head),
            "head_file": self.head_file,
            "expect_head": str(self.expect_head) if self.expect_head else None,
            "started_from": self.started_from,
            "checkpoint": self.checkpoint,
            "checkpoint_error": self.checkpoint_error,
            "problems": [p.as_dict() for p in self.problems],
            "projection_differs": list[JSONValue](self.projection_differs),
        }


def _hold(report: Report, table: Table, refs: Refs, rows: Iterable[RowValues], *, every_row: bool) -> int:
    """Hold `rows` against the digests the chain recorded for them; `every_row`: the rows are the
    whole table, so one without a ref was inserted outside anvilctl. Returns the rows checked."""
    name, checked = table.name, 0
    for values in rows:
        key = key_of(table, values)
        ref = refs.pop(key)
        if ref is None and every_row:
            report.problems.append(
                Problem("row not covered by the journal (inserted outside anvilctl)", None, name, key)
            )
        elif ref is not None and not bytes.fromhex(row_digest(table, values)).startswith(ref[0]):
            report.problems.append(
                Problem("content edited: row digest differs from its journal entry", ref[1], name, key)
            )
        checked += ref is not None or every_row
    for key, entry in refs.items():
        report.problems.append(
            Problem("row deleted: covered by the journal, gone from its table", entry, name, key)
        )
    return checked


def _check_triggers(s: Session, problems: list[Problem]) -> bool:
    """Name each append-only trigger that is missing or disabled; True if all are in place."""
    dialect = s.get_bind().dialect.name
    expected = expected_triggers(dialect, (*COVERED, AuditEntry.__tablename__))
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
    report.head_file = {"path": str(path) if path else None}
    if path is None:
        return
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


def _checkpoint_dict(cp: AuditCheckpoint) -> JSONObject:
    return {"id": cp.id, "head": f"{cp.seq}:{cp.hash}", "mode": cp.mode, "at": cp.at}


def _full(s: Session, report: Report) -> None:
    pins = {cp.seq: (cp.id, cp.hash) for cp in s.execute(select(AuditCheckpoint)).scalars()}
    walk = chainwalk.walk(s, audit.EMPTY, report.problems, {seq: h for seq, (_id, h) in pins.items()})
    report.entries_checked = walk.entries
    report.head = walk.end
    for seq, (cp_id, cp_hash) in sorted(pins.items()):
        if seq > walk.end.seq:
            _check_pinned(s, walk.end, Head(seq, cp_hash), f"checkpoint {cp_id}", report.problems)
    for name, table in COVERED.items():  # every row, against the refs of the whole chain
        rows = s.execute(select(table).execution_options(yield_per=BATCH)).mappings()
        report.counts[name] = _hold(report, table, walk.refs.pop(name, Refs()), rows, every_row=True)
        report.rows_checked += report.counts[name]
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
    for name, refs in walk.refs.items():  # the rows the walked entries cover, by key, 500 at a time
        table = COVERED[name]
        (pk,) = table.primary_key.columns
        keys = [key for key, _entry in refs.items()]
        rows = (
            v
            for i in range(0, len(keys), 500)
            for v in s.execute(select(table).where(pk.in_(keys[i : i + 500]))).mappings()
        )
        report.rows_checked += _hold(report, table, refs, rows, every_row=False)
    if report.problems:
        return "the entries after the checkpoint have problems"
    before = json.loads(cp.counts_json)
    counts = {
        name: int(s.execute(select(func.count()).select_from(t)).scalar_one()) for name, t in COVERED.items()
    }
    for name, count in counts.items():
        if count != before.get(name, 0) + added.get(name, 0):
            return f"{name} holds {count} rows, not what checkpoint {cp.id} and the entries after it cover"
    report.counts = counts
    return None


def verify(store: Store, *, full: bool = False, expect_head: Head | None = None) -> Report:
    """Verify the record (see the module doc); a clean run records a checkpoint."""
    report = Report(mode="full" if full else "incremental", expect_head=expect_head)
    with store.read() as s:  # one read transaction: counts and chain describe the same moment
        dialect = s.get_bind().dialect.name
        if dialect == "postgresql":
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        elif dialect == "sqlite":
            report.schema_version = int(s.execute(text("PRAGMA schema_version")).scalar_one())
        trigger_problems: list[Problem] = []
        triggers_ok = _check_triggers(s, trigger_problems)
        if not full:
            cp = s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id.desc()).limit(1)).scalar()
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
        except (OperationalError, Unavailable) as exc:  # read-only, busy or full: verified all the same
            # the database's own words, also where the store's edge translated them
            orig = exc.orig if isinstance(exc, OperationalError) else getattr(exc.__cause__, "orig", None)
            report.checkpoint_error = str(orig or exc)
            log.warning("audit.checkpoint_unrecorded", error=report.checkpoint_error)
    return report


def _record_checkpoint(store: Store, report: Report) -> JSONObject:
    # A checkpoint only saves later work: when another writer holds the database, skip it.
    with store.write(busy_ms=200) as s:
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


def host_counts(store: Store, host: int | None) -> list[JSONObject]:
    """Per host (`host`, or every registered host when None): its name and how many journal
    entries it wrote; the report's `hosts`. The chain itself is one for the whole fleet."""
    entries = select(func.count()).where(AuditEntry.host_id == Host.id).scalar_subquery()
    q = select(Host.id, Host.name, entries.label("entries")).order_by(Host.id)
    with store.read() as s:
        rows = s.execute(q if host is None else q.where(Host.id == host))
        return [{"host": str(r.name), "host_id": int(r.id), "entries": int(r.entries)} for r in rows]
