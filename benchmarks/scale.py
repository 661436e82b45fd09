"""Scale: guards, status, audit and the README queries on state databases of 1k/10k/100k transactions.

    .venv/bin/python benchmarks/scale.py [--sizes 1000 10000 100000] [--cache DIR] [--markdown-out FILE]

The databases hold copies of real transactions. A fake host (`ANVIL_BACKEND=fake`, the
shipped fakes) adopts an incumbent and runs load, promote and rollback through the real
engine and Store; then one more promote, rollback and load (with the promote's verified
decision) is the template: every row those writes added, in every table, the audit
journal included. A database of N transactions is the fake host's database plus copies
of the template: fresh transaction, lock and decision IDs (in every column and JSON
body), integer keys renumbered, timestamps moved ten minutes on per transaction, and the
audit journal chained again with `anvil_ctl.persistence.audit`'s own hash, its entries
stored as the Store stores them; the current-state projection is then rebuilt from that
history. Rows are
inserted in large transactions with `synchronous=OFF` (the Store commits every write with
an fsync: hours at 100k, not minutes). Built databases are kept in --cache, keyed by
the schema and the template, and reused.

Timed on each, median of --repeat runs, in a process of its own per size (the command's
library function, what the CLI calls after it started; a process that built and measured
the smaller sizes first slows the later ones), and as `anvilctl` processes where marked:
- every guard of load, promote and rollback, the median of at least five dry runs (the world
  is the fake host's, at the template's end: the candidate loaded, the incumbent stopped);
- `rollback --dry-run` (its guards and its starting snapshot): the fastest and the median
  of at least five runs, and the time spent in SQLite beside them (`dbtime`), also as a
  process;
- `status`, `audit transactions --limit 20`, `audit show PREFIX`, `fleet status` (which reads
  every host's unresolved transactions and newest recheck), also as processes;
- `audit history`, `audit decisions` and `audit incumbents` with `--limit 20`, finding
  revision 3 for `rollback --to 3`, and promote's look-up of the waivers its decision relied
  on (`BEYOND_TARGETS`);
- each `sqlite3 state/anvil.db "..."` query of README.md (a transaction prefix and a time
  from the middle of the history), with its EXPLAIN QUERY PLAN;
- `audit verify`: `--full` first (a fresh copy has no checkpoint; this records one), then
  a promote, rollback and load, then the incremental run from that checkpoint, each with
  the entries and rows it checked; both also as processes (after one more transaction);
- the database's size and the bytes per transaction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sqlalchemy import MetaData, Table, column, create_engine, delete, event, insert, select
from sqlalchemy.orm import Session

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import admin, audit, lifecycle, transactions
from anvil_ctl.commands.evidence import audit_decisions
from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.steps import Refusal
from anvil_ctl.engine.plans.promote import waived_checks
from anvil_ctl.engine.plans.rollback import resolve_target
from anvil_ctl.log import configure
from anvil_ctl.persistence import audit as audit_chain
from anvil_ctl.persistence import projection, qualification
from anvil_ctl.persistence.coverage import COVERED, ref_of
from anvil_ctl.persistence.current_models import PROJECTION_MODELS, PROJECTION_TABLES
from anvil_ctl.persistence.migrate import SCHEMA_REVISION
from benchmarks.dbtime import timed_runs
from tests.unit.fakehost import FakeHost, make_fake_host, reopen

SLOT = "primary"
STEP = timedelta(minutes=10)
"""How far each copied transaction moves on: 100k transactions span about two years."""
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ANVILCTL = str(Path(sys.executable).with_name("anvilctl"))
COPY_FORMAT = 13
"""How copies are written (part of a cached database's key)."""


def read_back(value: Any) -> Any:
    """A stored value of a history row as the Store reads it (what its digest covers): a
    compressed JSON body (`models.Compressed`) as its text."""
    return zlib.decompress(value).decode() if isinstance(value, bytes) else value


# -- the template: real transactions on the fake host -----------------------------------------


def decide(host: FakeHost) -> None:
    """A verified decision for the loaded candidate (what a passing `qualify` records)."""
    app = host.app()
    cand = app.store.current_identity(SLOT, "candidate")
    assert cand is not None
    qualification.record_decision(
        app.store,
        decision_id=hashlib.sha256(f"{cand.qualification_digest}-{uuid.uuid4()}".encode()).hexdigest(),
        tx_id=None,
        slot=SLOT,
        identity_digest=cand.qualification_digest,
        container_id=cand.container_id,
        outcome="verified",
    )


def committed(outcome: Any) -> None:
    assert outcome.state.value == "committed", outcome.reason


def cycle(host: FakeHost, *, load_first: bool) -> None:
    """promote, rollback, load (with a load first on a host that has no candidate yet)."""
    if load_first:
        committed(transactions.load(host.app(), slot=SLOT, candidate=host.candidate()))
    decide(host)
    committed(lifecycle.promote(host.app(), slot=SLOT, approved_by="bench"))
    committed(lifecycle.rollback(host.app(), slot=SLOT))
    committed(transactions.load(host.app(), slot=SLOT, candidate=host.candidate(name="cand-2")))


def rowids(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        names = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        return {n: con.execute(f'select coalesce(max(rowid), 0) from "{n}"').fetchone()[0] for n in names}
    finally:
        con.close()


@dataclass
class Template:
    root: Path
    """The fake host: its state database (the base of every size) and its world file."""
    rows: dict[str, list[dict[str, Any]]]
    """Table -> the rows the template's writes added, in rowid order, as stored."""
    transactions: int
    """Transactions in the base database."""

    @property
    def db(self) -> Path:
        return self.root / "state" / "anvil.db"

    @property
    def per_copy(self) -> int:
        return len(self.rows.get("transactions", []))

    def digest(self) -> str:
        """What a cached database depends on: the schema head and the template's shape."""
        shape = {t: sorted(rows[0]) if rows else [] for t, rows in sorted(self.rows.items())}
        counts = {t: len(rows) for t, rows in self.rows.items()}
        blob = json.dumps([SCHEMA_REVISION, COPY_FORMAT, shape, counts], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def make_template(root: Path) -> Template:
    root.mkdir(parents=True)
    host = make_fake_host(root)
    cycle(host, load_first=True)  # warm: the host has served, been promoted, rolled back, loaded
    before = rowids(host.settings.state_dir / "anvil.db")
    cycle(host, load_first=False)
    db = host.settings.state_dir / "anvil.db"
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        for table, last in before.items():
            # The projection is derived: rebuilt from the copied history once they are in.
            if table == "alembic_version" or table in PROJECTION_TABLES:
                continue
            got = con.execute(f'select * from "{table}" where rowid > ? order by rowid', (last,)).fetchall()
            if got:
                rows[table] = [dict(r) for r in got]
        base = con.execute("select count(*) from transactions").fetchone()[0]
    finally:
        con.close()
    return Template(root=root, rows=rows, transactions=base)


# -- copying it -------------------------------------------------------------------------------


def renamed(old: str, copy: int) -> str:
    """A fresh ID of the same shape for copy `copy` (UUIDs stay UUIDs, hex stays hex)."""
    digest = hashlib.sha256(f"{old}/{copy}".encode()).hexdigest()
    if UUID.match(old):
        return str(uuid.UUID(digest[:32]))
    return digest[: len(old)] if re.fullmatch(r"[0-9a-f]+", old) else f"{old}-{copy}"


def shifted(value: str, delta: timedelta) -> str:
    stamp = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ" if "." in value else "%Y-%m-%dT%H:%M:%SZ")
    return (stamp.replace(tzinfo=UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def copied(value: Any, names: dict[str, str], delta: timedelta) -> Any:
    """A column value of a copy: renamed IDs (also inside JSON), timestamps moved on."""
    if isinstance(value, bytes):  # a compressed JSON body
        return zlib.compress(copied(read_back(value), names, delta).encode(), 9)
    if not isinstance(value, str):
        return value
    if value in names:
        return names[value]
    if ISO.match(value):
        return shifted(value, delta)
    for old, new in names.items():
        if old in value:
            value = value.replace(old, new)
    return value


class Copier:
    """Writes copies of the template into a database, the audit chain continued."""

    def __init__(self, template: Template, db: Path) -> None:
        self.t = template
        self.engine = create_engine(f"sqlite:///{db}")

        @event.listens_for(self.engine, "connect")
        def _fast(conn: sqlite3.Connection, _record: Any) -> None:
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA foreign_keys=OFF")

        self.meta = MetaData()
        self.meta.reflect(self.engine)
        self.tables: dict[str, Table] = {
            t.name: t for t in self.meta.sorted_tables if t.name in template.rows
        }
        self.string_keys = [
            str(r[pk.name])
            for name, t in self.tables.items()
            for pk in t.primary_key.columns
            if pk.type.python_type is str
            for r in template.rows[name]
        ]
        with self.engine.connect() as conn:
            self.next_id = {
                name: (
                    conn.execute(
                        select(column("rowid")).select_from(t).order_by(column("rowid").desc()).limit(1)
                    ).scalar()
                    or 0
                )
                + 1
                for name, t in self.tables.items()
            }
            journal = self.tables["audit_journal"]
            last = conn.execute(select(journal).order_by(journal.c.id.desc()).limit(1)).mappings().first()
        assert last is not None
        self.prev_hash = str(last["hash"])
        self.span = max(STEP * template.per_copy, timedelta(seconds=1))

    def row(self, table: str, row: dict[str, Any], copy: int, names: dict[str, str]) -> dict[str, Any]:
        delta = self.span * (copy + 1)
        out = {key: copied(value, names, delta) for key, value in row.items()}
        t = self.tables[table]
        for pk in t.primary_key.columns:
            if pk.type.python_type is int:
                out[pk.name] = self.next_id[table]
                self.next_id[table] += 1
        return out

    def chain(
        self, row: dict[str, Any], template_rows: str, made: dict[tuple[str, Any], dict[str, Any]]
    ) -> dict[str, Any]:
        """The audit row continued on the chain with persistence.audit's own hash, covering
        the copies of the rows its template entry covered (their new keys and digests)."""
        covered = []
        for table, key, digest in json.loads(template_rows or "[]"):
            new = made.get((table, key))
            if new is None or table not in COVERED:
                covered.append([table, key, digest])
            else:
                as_read = {k: read_back(v) for k, v in new.items()}
                ref_table, ref_key, hex_digest = ref_of(COVERED[table], as_read)
                covered.append([ref_table, ref_key, audit_chain.compact_digest(hex_digest)])
        rows_json = canonical_json(covered)
        row["rows_json"] = rows_json
        digest = audit_chain.entry_hash(self.prev_hash, row)
        row["prev_hash"] = self.prev_hash[: audit_chain.LINK_TAG]
        row["hash"] = digest
        self.prev_hash = digest
        return row

    def copies(self, count: int, progress: Callable[[int], None]) -> None:
        batch = 200
        for start in range(0, count, batch):
            out: dict[str, list[dict[str, Any]]] = {name: [] for name in self.tables}
            for copy in range(start, min(count, start + batch)):
                names = {old: renamed(old, copy) for old in self.string_keys}
                made: dict[tuple[str, Any], dict[str, Any]] = {}
                # the journal last: its entries cover the copies made before them
                for name in sorted(self.tables, key=lambda n: n == "audit_journal"):
                    (pk,) = self.tables[name].primary_key.columns
                    for r in self.t.rows[name]:
                        new = self.row(name, r, copy, names)
                        if name == "audit_journal":
                            out[name].append(self.chain(new, r["rows_json"] or "[]", made))
                            continue
                        made[(name, r[pk.name])] = new
                        out[name].append(new)
            with self.engine.begin() as conn:
                for name, t in self.tables.items():
                    if out[name]:
                        conn.execute(insert(t), out[name])
            progress(min(count, start + batch))


def build(template: Template, size: int, cache: Path) -> Path:
    """The database of `size` transactions, built once per schema and template."""
    db = cache / f"scale-{template.digest()}-{size}.db"
    if db.exists():
        return db
    copies = max(0, (size - template.transactions) // max(template.per_copy, 1))
    work = db.with_suffix(".building")
    shutil.copyfile(template.db, work)
    started = time.monotonic()

    def progress(done: int) -> None:
        if done % 5000 < 200 or done == copies:
            rate = done / max(time.monotonic() - started, 1e-6)
            print(f"  {size}: {done}/{copies} copies ({rate:,.0f}/s)", file=sys.stderr, flush=True)

    copier = Copier(template, work)
    copier.copies(copies, progress)
    with Session(copier.engine) as session, session.begin():
        for model in PROJECTION_MODELS.values():
            session.execute(delete(model))
        projection.write_rebuilt(session)
    copier.engine.dispose()
    con = sqlite3.connect(work)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # No ANALYZE: anvilctl never runs it, so a host's planner has no sqlite_stat1 and the
    # measured plans must be the ones it gets. (With statistics of a history where every
    # transaction committed, the compensation query scanned tx_current instead of
    # searching ix_tx_current_state.)
    con.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{work}{suffix}").unlink(missing_ok=True)
    work.rename(db)
    return db


# -- measuring ---------------------------------------------------------------------------------


@contextmanager
def host_on(template: Template, db: Path) -> Iterator[FakeHost]:
    """The fake host at the template's end, its state database replaced by `db` (copied)."""
    with tempfile.TemporaryDirectory(dir=db.parent) as tmp:
        root = Path(tmp)
        shutil.copytree(template.root, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("anvil.db*"))
        shutil.copyfile(db, root / "state" / "anvil.db")
        host = reopen(root)
        app = host.app()
        app.store.sync_head_file()  # the copied history's head, as its own writes would have left it
        app.close()
        yield host


def median_s(fn: Callable[[], Any], repeat: int, budget_s: float = 20.0) -> float:
    """Median seconds of up to `repeat` runs (fewer once they took `budget_s` together)."""
    times: list[float] = []
    while len(times) < repeat and sum(times) < budget_s:
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def guard_times(app: App, host: FakeHost, repeat: int) -> dict[str, float]:
    """Median seconds of every guard of load, promote and rollback over `repeat` dry runs of
    each, every guard run whatever the others say (a single run times the moment's scheduling
    and disk as much as the guard)."""
    from anvil_ctl.engine import runner

    seen: dict[str, list[float]] = {}
    real = runner.first_refusal

    def every(guards: Any, gctx: Any) -> Refusal | None:
        first = None
        for guard in guards:
            started = time.perf_counter()
            try:
                refusal = guard.check(gctx)
            except Exception as exc:  # a guard that cannot check refuses; the time still counts
                refusal = Refusal(type(exc).__name__, str(exc), {})
            name = f"{gctx.kind}: {guard.name}"
            seen.setdefault(name, []).append(time.perf_counter() - started)
            first = first or refusal
        return first

    runner.first_refusal = every  # type: ignore[assignment]
    try:
        for _ in range(repeat):
            lifecycle.rollback(app, slot=SLOT, dry_run=True)
            lifecycle.promote(app, slot=SLOT, approved_by="bench", dry_run=True)
            transactions.load(app, slot=SLOT, candidate=host.candidate(name="cand-3"), dry_run=True)
    finally:
        runner.first_refusal = real  # type: ignore[assignment]
    return {name: statistics.median(times) for name, times in seen.items()}


def readme_queries() -> list[tuple[str, str]]:
    """(comment, SQL) of every `sqlite3 state/anvil.db "..."` line of README.md."""
    text = (REPO / "README.md").read_text()
    found = []
    for m in re.finditer(r'(?:# ([^\n]*)\n)?sqlite3 state/anvil\.db "((?:[^"\\]|\\.)*)"', text):
        sql = " ".join(m.group(2).replace('\\"', '"').split())
        found.append((m.group(1) or sql.split(" from ")[0], sql))
    return found


def instantiate(sql: str, prefix: str, moment: str) -> str:
    """A README query with its example transaction prefix and time replaced by real ones."""
    sql = re.sub(r"tx_id like '[0-9a-f]+%'", f"tx_id like '{prefix}%'", sql)
    sql = re.sub(r"tx_id glob '[0-9a-f]+\*'", f"tx_id glob '{prefix}*'", sql)
    return re.sub(r"'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ'", f"'{moment}'", sql)


def query_plan(con: sqlite3.Connection, sql: str) -> list[str]:
    return [str(r[3]) for r in con.execute(f"EXPLAIN QUERY PLAN {sql}")]


CLI_TIMEOUT_S = 900


def cli_s(host: FakeHost, *args: str) -> float:
    """Seconds of one `anvilctl` process; a run past CLI_TIMEOUT_S is killed and reads as
    infinite (the table says so) rather than losing every measure taken before it."""
    started = time.perf_counter()
    try:
        subprocess.run(
            [ANVILCTL, *args], env=host.env(), capture_output=True, timeout=CLI_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return float("inf")
    return time.perf_counter() - started


BEYOND_TARGETS = (
    "audit history --limit 20",
    "audit decisions --limit 20",
    "audit incumbents --limit 20",
    "rollback --to 3: finding revision 3",
    "promote: the waivers its decision relied on",
)
"""Reads the issue names no target for, timed because their cost must not grow with history
either (each read every revision, decision or identity recorded before migration 0021)."""


def measure(template: Template, db: Path, size: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"size": size, "bytes": db.stat().st_size}
    with host_on(template, db) as host:
        app = host.app()
        out["guards"] = guard_times(app, host, max(5, repeat))
        con = sqlite3.connect(f"file:{host.settings.state_dir / 'anvil.db'}?mode=ro", uri=True)
        out["transactions"] = con.execute("select count(*) from transactions").fetchone()[0]
        middle_id, middle_at = con.execute(
            "select id, created_at from transactions order by created_at limit 1 offset ?",
            (out["transactions"] // 2,),
        ).fetchone()
        prefix, moment = str(middle_id)[:8], str(middle_at)[:19] + "Z"
        (newest_decision,) = con.execute("select id from decisions order by at desc limit 1").fetchone()
        out["dry_run"] = timed_runs(lambda: lifecycle.rollback(app, slot=SLOT, dry_run=True), max(5, repeat))
        timed: dict[str, float] = {
            "status": median_s(lambda: admin.status(app), repeat),
            "audit transactions --limit 20": median_s(lambda: audit.transactions(app, limit=20), repeat),
            f"audit show {prefix}": median_s(lambda: audit.show(app, prefix), repeat),
            "fleet status": median_s(lambda: audit.fleet_status(app), repeat),
            "audit history --limit 20": median_s(lambda: audit.history(app, slot=SLOT, limit=20), repeat),
            "audit decisions --limit 20": median_s(lambda: audit_decisions(app, limit=20), repeat),
            "audit incumbents --limit 20": median_s(lambda: audit.identities(app, limit=20), repeat),
            "rollback --to 3: finding revision 3": median_s(
                lambda: resolve_target(app.store, SLOT, "3"), repeat
            ),
            "promote: the waivers its decision relied on": median_s(
                lambda: waived_checks(app.world(), newest_decision), repeat
            ),
        }
        out["library_s"] = timed
        queries = []
        for comment, sql in readme_queries():
            real = instantiate(sql, prefix, moment)
            seconds = median_s(lambda real=real: con.execute(real).fetchall(), repeat)
            queries.append({"query": comment, "sql": real, "s": seconds, "plan": query_plan(con, real)})
        con.close()
        out["queries"] = queries
        out["cli_s"] = {
            "rollback --dry-run": cli_s(host, "rollback", "--slot", SLOT, "--dry-run"),
            "status": cli_s(host, "status"),
            "audit transactions --limit 20": cli_s(host, "audit", "transactions", "--limit", "20"),
            "audit show PREFIX": cli_s(host, "audit", "show", prefix),
            "fleet status": cli_s(host, "fleet", "status"),
        }
        out["verify"] = verify_times(app, host)
        app.close()
    return out


def verify_run(app: App, *, full: bool) -> dict[str, Any]:
    started = time.perf_counter()
    report = audit.verify(app, full=full)
    seconds = time.perf_counter() - started
    assert report["ok"], report["problems"][:5]
    return {
        "s": seconds,
        "mode": report["mode"],
        "escalated": report["escalated"],
        "entries_checked": report["entries_checked"],
        "rows_checked": report["rows_checked"],
    }


def verify_times(app: App, host: FakeHost) -> dict[str, Any]:
    """`--full` (recording a checkpoint), then new transactions, then incremental from it;
    then each again as an `anvilctl` process (three more transactions past the checkpoint)."""
    full = verify_run(app, full=True)
    cycle(host, load_first=False)  # promote, rollback, load: three transactions past the checkpoint
    incremental = verify_run(app, full=False)
    assert incremental["mode"] == "incremental" and not incremental["escalated"], incremental
    incremental["new_transactions"] = 3
    cycle(host, load_first=False)  # three more for the process to check
    cli_incremental = cli_s(host, "audit", "verify")
    return {
        "full": full,
        "incremental": incremental,
        "cli_s": {
            "audit verify": cli_incremental,
            "audit verify --full": cli_s(host, "audit", "verify", "--full"),
        },
    }


# -- report ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    if seconds == float("inf"):
        return f"over {CLI_TIMEOUT_S} s (killed)"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _marginal(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What each transaction between two databases added: the size difference over the
    difference in transactions counted in them (the empty schema's pages and the fake
    host's own rows weigh on the small database's per-transaction figure, not on this)."""
    added = after.get("transactions", after["size"]) - before.get("transactions", before["size"])
    return f"{(after['bytes'] - before['bytes']) / max(added, 1):,.0f} B" if added > 0 else ""


def markdown(results: list[dict[str, Any]]) -> str:
    sizes = [f"{r['size']:,} tx" for r in results]
    lines = [
        "| measure | " + " | ".join(sizes) + " | target at 100k |",
        "|---|" + "---|" * len(sizes) + "---|",
        "| size | "
        + " | ".join(
            f"{r['bytes'] / 1e6:,.1f} MB ({r['bytes'] / r['size'] / 1000:,.1f} KB/tx)" for r in results
        )
        + " | reported (no target) |",
        "| bytes per transaction added since the size before (no fixed schema cost) | "
        + " | ".join(_marginal(results[i - 1], r) if i else "" for i, r in enumerate(results))
        + " | reported (no target) |",
    ]
    guard_names = sorted(results[0]["guards"])
    worst = [max(r["guards"].items(), key=lambda kv: kv[1]) for r in results]
    lines.append("| slowest guard | " + " | ".join(f"{ms(s)} ({n})" for n, s in worst) + " | <= 50 ms each |")
    unresolved = [n for n in guard_names if "NoUnresolvedTransaction" in n]
    for name in unresolved:
        lines.append(
            f"| {name} | " + " | ".join(ms(r["guards"].get(name, 0)) for r in results) + " | <= 50 ms |"
        )
    dry = [r["dry_run"] for r in results]
    lines.append(
        f"| rollback --dry-run, fastest of {dry[0]['runs']} (median) | "
        + " | ".join(
            f"{ms(d['min_s'])} (x{d['min_s'] / dry[0]['min_s']:.2f}; median {ms(d['median_s'])})" for d in dry
        )
        + f" | within 10 % of {results[0]['size']:,} |"
    )
    lines.append(
        "| rollback --dry-run, time in SQLite, fastest (median) | "
        + " | ".join(
            f"{ms(d['db_min_s'])} (x{d['db_min_s'] / dry[0]['db_min_s']:.2f}; median {ms(d['db_median_s'])})"
            for d in dry
        )
        + " | |"
    )
    for key in ("status", "audit transactions --limit 20", "fleet status"):
        lines.append(f"| {key} | " + " | ".join(ms(r["library_s"][key]) for r in results) + " | <= 50 ms |")
    for key in BEYOND_TARGETS:
        row = " | ".join(ms(r["library_s"][key]) for r in results)
        lines.append(f"| {key} | {row} | flat |")
    lines.append(
        "| audit show PREFIX | "
        + " | ".join(
            ms(next(v for k, v in r["library_s"].items() if k.startswith("audit show"))) for r in results
        )
        + " | <= 50 ms |"
    )
    for i, q in enumerate(results[0]["queries"]):
        lines.append(
            f"| README: {q['query']} | "
            + " | ".join(ms(r["queries"][i]["s"]) for r in results)
            + " | <= 50 ms |"
        )

    def checked(v: dict[str, Any]) -> str:
        return f"{ms(v['s'])} ({v['entries_checked']:,} entries, {v['rows_checked']:,} rows)"

    lines.append(
        f"| audit verify, incremental ({results[0]['verify']['incremental']['new_transactions']} "
        "transactions past the checkpoint) | "
        + " | ".join(checked(r["verify"]["incremental"]) for r in results)
        + " | <= 1 s |"
    )
    lines.append(
        "| audit verify --full | " + " | ".join(checked(r["verify"]["full"]) for r in results) + " | |"
    )
    lines += ["", "As `anvilctl` processes (interpreter start and imports included):", ""]
    lines += ["| command | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    for key in results[0]["cli_s"]:
        lines.append(f"| `anvilctl {key}` | " + " | ".join(ms(r["cli_s"][key]) for r in results) + " |")
    for key in results[0]["verify"]["cli_s"]:
        lines.append(
            f"| `anvilctl {key}` | " + " | ".join(ms(r["verify"]["cli_s"][key]) for r in results) + " |"
        )
    last = results[-1]
    lines += ["", f"EXPLAIN QUERY PLAN of the README queries at {last['size']:,} transactions:", "", "```"]
    for q in last["queries"]:
        lines.append(f"-- {q['query']}")
        lines += [f"   {step}" for step in q["plan"]]
    lines.append("```")
    lines += ["", "Every guard of load, promote and rollback (median), run whatever the others said:", ""]
    lines += ["| guard | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    for name in guard_names:
        lines.append(f"| {name} | " + " | ".join(ms(r["guards"].get(name, 0)) for r in results) + " |")
    return "\n".join(lines)


def measure_apart(template: Template, db: Path, size: int, repeat: int) -> dict[str, Any]:
    """`measure` in a process of its own: what building the databases and measuring the
    sizes before left on this process's heap made the later sizes slower (the collector's
    passes over it: `rollback --dry-run` x1.6 at 10k measured after 1k here, x1.0 alone)."""
    argv = ["--measure-one", str(db), "--template-root", str(template.root)]
    r = subprocess.run(
        [sys.executable, __file__, *argv, "--sizes", str(size), "--repeat", str(repeat)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"measuring {size} failed:\n{r.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "anvil" / "bench")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--markdown-out", type=Path, help="also write the tables here (make bench)")
    parser.add_argument(
        "--build-only", action="store_true", help="build (or find) the databases in --cache, measure nothing"
    )
    parser.add_argument("--measure-one", type=Path, help=argparse.SUPPRESS)  # measure_apart's child
    parser.add_argument("--template-root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure("console", "warning")  # the engine's info lines would drown the tables
    if args.measure_one is not None:  # one size, in this fresh process; JSON on stdout
        only = Template(root=args.template_root, rows={}, transactions=0)
        print(json.dumps(measure(only, args.measure_one, args.sizes[0], args.repeat)))
        return 0
    args.cache.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
        print("template: real transactions on the fake host", file=sys.stderr, flush=True)
        template = make_template(Path(tmp) / "host")
        print(
            f"template: {template.per_copy} transactions, "
            + ", ".join(f"{t} {len(r)}" for t, r in sorted(template.rows.items())),
            file=sys.stderr,
            flush=True,
        )
        for size in sorted(args.sizes):
            db = build(template, size, args.cache)
            if args.build_only:
                print(f"built {db} ({db.stat().st_size / 1e6:,.1f} MB)", file=sys.stderr, flush=True)
                continue
            print(
                f"measuring {size:,} transactions ({db.stat().st_size / 1e6:,.1f} MB)",
                file=sys.stderr,
                flush=True,
            )
            results.append(measure_apart(template, db, size, args.repeat))
            if args.json:  # each size as it is measured: a later failure keeps it
                args.json.write_text(json.dumps(results, indent=2))
    if args.build_only:
        return 0
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    if args.markdown_out:
        args.markdown_out.write_text(markdown(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
