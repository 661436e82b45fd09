"""`audit verify` at scale: full and incremental, on a journal of N transactions.

Builds an SQLite state database at the current schema holding N load-shaped
transactions (per transaction 30 journal entries covering 32 history rows: lock
and release, the transaction and three states, two snapshots and their diff, ten
steps' intent and result, a candidate identity, two GPU claims), chained and
digested with anvil_ctl's own functions and bulk-inserted (the Store would commit
each write with an fsync: hours, not minutes). Then it times:

- `verify --full` (every entry and row), which records the first checkpoint;
- one more transaction written through the Store, as a command would;
- `verify` (incremental) in this process, and `anvilctl audit verify` as a child
  (interpreter start and imports included), three times each.

    .venv/bin/python benchmarks/audit_verify.py --transactions 100000 [--db /tmp/bench.db] [--keep]
    .venv/bin/python benchmarks/audit_verify.py --db /tmp/bench.db --reuse   # again, same database

Wall and CPU seconds are both printed: on a shared machine the wall time says more
about the neighbours. Exits 1 when the incremental CLI run takes more than --budget
CPU seconds (1.0).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from anvil_ctl.core.model import canonical_json
from anvil_ctl.core.ports import Owner
from anvil_ctl.persistence import audit
from anvil_ctl.persistence.coverage import COVERED, ref_of
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.head import head_path_for, write_head
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.persistence.models import AuditEntry
from anvil_ctl.persistence.store import Store
from anvil_ctl.persistence.verify import verify

REPO = Path(__file__).resolve().parents[1]
STEPS = 10
SNAPSHOT_BODY = canonical_json({"slots": {"primary": {"binding": "127.0.0.1:8001", "pad": "x" * 400}}})


class Builder:
    """Rows and chained entries, in memory until `flush`."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = defaultdict(int)
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.entries: list[dict[str, Any]] = []
        self.head = audit.EMPTY
        self.clock = 0

    def at(self) -> str:
        self.clock += 1
        return f"2026-01-01T00:00:00.{self.clock:012d}Z"

    def row(self, table: str, **values: Any) -> dict[str, Any]:
        t = COVERED[table]
        (pk,) = t.primary_key.columns
        if pk.name not in values:
            self.ids[table] += 1
            values[pk.name] = self.ids[table]
        self.rows[table].append(values)
        return values

    def entry(
        self, event: str, tx_id: str | None, payload: dict[str, Any], *rows: tuple[str, dict[str, Any]]
    ) -> None:
        seq = self.head.seq + 1
        at = self.at()
        body = canonical_json(payload)
        refs = canonical_json([list(ref_of(COVERED[t], r)) for t, r in rows])
        digest = audit.entry_hash(
            self.head.hash, seq, at=at, tx_id=tx_id, event=event, payload=body, rows=refs
        )
        self.entries.append(
            {
                "id": seq,
                "at": at,
                "tx_id": tx_id,
                "event": event,
                "payload_json": body,
                "prev_hash": self.head.hash,
                "hash": digest,
                "rows_json": refs,
            }
        )
        self.head = audit.Head(seq, digest)

    def transaction(self) -> None:
        tx = str(uuid.uuid4())
        lock = self.row(
            "locks",
            id=str(uuid.uuid4()),
            host="h",
            pid=1,
            boot_id="b",
            command="load",
            tx_id=tx,
            since=self.at(),
        )
        self.entry("lock.acquired", tx, {"lock_id": lock["id"]}, ("locks", lock))
        t = self.row(
            "transactions",
            id=tx,
            kind="load",
            slot="primary",
            args_json="{}",
            owner_pid=1,
            owner_host="h",
            owner_boot_id="b",
            created_at=self.at(),
        )
        states = [("planned", self.state(tx, "planned"))]
        self.entry(
            "tx.planned", tx, {"kind": "load"}, ("transactions", t), ("transaction_states", states[0][1])
        )
        before = self.row(
            "snapshots", tx_id=tx, label="before", sha256="b" * 64, body_json=SNAPSHOT_BODY, at=self.at()
        )
        self.entry("snapshot", tx, {"label": "before"}, ("snapshots", before))
        self.entry("tx.running", tx, {}, ("transaction_states", self.state(tx, "running")))
        for seq in range(STEPS):
            for event in ("intent", "result"):
                step = self.row(
                    "step_events",
                    tx_id=tx,
                    seq=seq,
                    step=f"step-{seq}",
                    phase="do",
                    event=event,
                    detail_json='{"ok":true}',
                    at=self.at(),
                )
                self.entry(f"step.do.{event}", tx, {"seq": seq}, ("step_events", step))
        ident = self.row(
            "identities",
            tx_id=tx,
            slot="primary",
            role="candidate",
            digest="d" * 64,
            container_id="c" * 64,
            image_id="sha256:" + "e" * 64,
            served_model="m",
            body_json="{}",
            at=self.at(),
        )
        self.entry("identity.candidate", tx, {}, ("identities", ident))
        claims = [
            self.row(
                "gpu_ownership_events",
                role=role,
                event="claim",
                container_id="c" * 64,
                tx_id=tx,
                mode="exclusive",
                slot="primary",
                at=self.at(),
            )
            for role in ("compute-a", "compute-b")
        ]
        self.entry("gpu.claim", tx, {}, *(("gpu_ownership_events", c) for c in claims))
        after = self.row(
            "snapshots", tx_id=tx, label="after", sha256="a" * 64, body_json=SNAPSHOT_BODY, at=self.at()
        )
        self.entry("snapshot", tx, {"label": "after"}, ("snapshots", after))
        diff = self.row(
            "snapshot_diffs",
            tx_id=tx,
            label="load",
            before_sha256="b" * 64,
            after_sha256="a" * 64,
            equal=0,
            changes_json="[]",
            at=self.at(),
        )
        self.entry("snapshot.diff", tx, {}, ("snapshot_diffs", diff))
        self.entry("tx.committed", tx, {}, ("transaction_states", self.state(tx, "committed")))
        release = self.row(
            "lock_releases", lock_id=lock["id"], how="released", by="h", reason="", at=self.at()
        )
        self.entry("lock.released", None, {}, ("lock_releases", release))

    def state(self, tx: str, state: str) -> dict[str, Any]:
        return self.row("transaction_states", tx_id=tx, state=state, reason="", data_json="{}", at=self.at())

    def flush(self, engine: Any) -> None:
        with engine.begin() as conn:
            for table in ("locks", "transactions"):  # parents first
                if self.rows[table]:
                    conn.execute(COVERED[table].insert(), self.rows.pop(table))
            for table, rows in self.rows.items():
                if rows:
                    conn.execute(COVERED[table].insert(), rows)
            if self.entries:
                conn.execute(AuditEntry.__table__.insert(), self.entries)
        self.rows.clear()
        self.entries.clear()


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument(
        "--db", type=Path, default=None, help="where to build it (default: a temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="verify the database at --db as it is")
    parser.add_argument("--skip-full", action="store_true", help="with --reuse: only the incremental runs")
    parser.add_argument(
        "--budget", type=float, default=1.0, help="CPU seconds allowed the incremental CLI run"
    )
    args = parser.parse_args()

    tmp = None
    if args.db is None:
        tmp = tempfile.mkdtemp(prefix="anvil-bench-")
        args.db = Path(tmp) / "anvil.db"
    url = f"sqlite:///{args.db.resolve()}"
    engine = make_engine(url)
    head_path = head_path_for(url, args.db.parent)
    store = Store(engine, head_path=head_path)
    if args.reuse and args.db.exists():
        print(f"reusing {args.db} ({args.db.stat().st_size / 2**20:.0f} MiB, head {store.head()})")
    else:
        upgrade(engine)
        builder = Builder()
        start = time.perf_counter()
        for i in range(args.transactions):
            builder.transaction()
            if i % 1000 == 999:
                builder.flush(engine)
        builder.flush(engine)
        build_s = time.perf_counter() - start
        write_head(head_path, builder.head)
        size_mib = args.db.stat().st_size / 2**20
        rows = sum(builder.ids.values()) + args.transactions * 2  # + transactions and locks (text keys)
        print(
            f"built {args.transactions} transactions: {builder.head.seq} entries, {rows} rows, "
            f"{size_mib:.0f} MiB, in {build_s:.0f} s"
        )

    if not args.skip_full:
        cpu = time.process_time()
        full_s, full = timed(lambda: verify(store, full=True))
        assert full.ok, full.problems[:5]
        print(
            f"verify --full:        {full_s:7.2f} s wall, {time.process_time() - cpu:7.2f} s CPU "
            f"({full.entries_checked} entries, {full.rows_checked} rows)"
        )

    # One more transaction through the Store's own write path, as a command writes.
    tx = store.begin(kind="load", slot="primary", args={}, owner=Owner(1, "h", "b"), tx_id="tx-load")
    store.step_event(tx, seq=0, step="s", phase="do", event="intent")

    inproc, inproc_cpu = [], []
    for _ in range(5):
        cpu = time.process_time()
        seconds, report = timed(lambda: verify(store))
        inproc_cpu.append(time.process_time() - cpu)
        assert report.ok and report.escalated is None, (report.escalated, report.problems[:5])
        inproc.append(seconds)
    print(
        f"verify (incremental): {statistics.median(inproc):7.3f} s wall, "
        f"{statistics.median(inproc_cpu):.3f} s CPU in process, median of 5 "
        f"({report.entries_checked} entries, {report.rows_checked} rows)"
    )

    env = {
        **os.environ,
        "ANVIL_STATE_DB": url,
        "ANVIL_STATE_DIR": str(args.db.parent),
        "ANVIL_LOG_FORMAT": "json",
    }
    cli, cli_cpu = [], []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl", "audit", "verify", "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        cli.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        assert r.returncode == 0, r.stderr + r.stdout
    print(
        f"anvilctl audit verify: {statistics.median(cli):7.3f} s wall, "
        f"{statistics.median(cli_cpu):.3f} s CPU, median of 5 (interpreter start and imports included)"
    )
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    if tmp and not args.keep:
        for p in Path(tmp).iterdir():
            p.unlink()
        Path(tmp).rmdir()
    return 0 if statistics.median(cli_cpu) <= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
