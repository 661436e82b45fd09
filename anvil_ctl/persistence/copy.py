"""`anvilctl db copy --to URL`: one host's whole history into another state database.

For a host that kept its record in SQLite joining a fleet's PostgreSQL database. The source's
chain must verify; its rows get new integer keys on the target (text keys kept) and each source
entry is re-chained as one target entry naming it (`copied: {seq, hash}`), then `db.copied`.
Checkpoints are not copied and the projection is rebuilt; a target that knows the host is refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.orm import Session

from anvil_ctl.core.errors import TargetHoldsHost
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.persistence import audit, projection
from anvil_ctl.persistence.coverage import COVERED, RowKey, key_of, row_digest
from anvil_ctl.persistence.db import translated, where
from anvil_ctl.persistence.models import FIRST_HOST_ID, HISTORY_TABLES, AuditEntry, Host
from anvil_ctl.persistence.store import Store, utcnow

NOT_COPIED = ("audit_checkpoints",)
"""History that names positions of the source's own chain."""

ORDER = tuple(t for t in HISTORY_TABLES if t not in ("hosts", *NOT_COPIED))
"""Parents before the rows that refer to them (`hosts` goes first, on its own)."""

SHARED = {"snapshot_blobs": ("snapshots", "sha256"), "identity_bodies": ("identities", "digest")}
"""Tables stored once per content, keyed by SHA-256: the host's are those its rows of (table,
column) name; one already in the target stays."""

_TIME = {"transactions": "created_at", "decisions": "at", "waivers": "created_at", "locks": "since"}
"""Tables keyed by text: copied in time order (a reclassification after the decision it names)."""


@dataclass
class CopyResult:
    host: str
    source: str
    target: str
    source_head: str
    target_head: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    entries: int = 0
    not_copied: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> JSONObject:
        return asdict(self)


def _source_rows(s: Session, name: str, host: int) -> list[dict[str, object]]:
    t = COVERED[name]
    (pk,) = t.primary_key.columns
    if name in SHARED:  # stored once per content: those this host's rows name
        naming = COVERED[SHARED[name][0]]
        named = sorted(
            set(s.execute(select(naming.c[SHARED[name][1]]).where(naming.c.host_id == host)).scalars())
        )
        rows: list[dict[str, object]] = []
        for start in range(0, len(named), 500):
            chunk = named[start : start + 500]
            rows += [dict(r) for r in s.execute(select(t).where(pk.in_(chunk)).order_by(pk)).mappings()]
        return sorted(rows, key=lambda r: str(r[pk.name]))
    q = select(t).where(t.c.host_id == host).order_by(t.c[_TIME.get(name, pk.name)], pk)
    return [dict(r) for r in s.execute(q).mappings()]


def copy_host(source: Store, target_engine: Engine) -> CopyResult:
    """Copy `source`'s host into `target_engine`, migrated to head, in one transaction (see the
    module doc). The source's chain must verify in full (checked by the caller)."""
    host_name = source.host_name or ""
    result = CopyResult(
        host=host_name,
        source=where(source.engine),
        target=where(target_engine),
        source_head=str(source.head()),
    )
    with source.read() as src:
        host_row = src.execute(select(Host).where(Host.id == source.host)).scalar_one()
        host_values: dict[str, object] = {c.name: getattr(host_row, c.key) for c in Host.__table__.columns}
        rows = {name: _source_rows(src, name, source.host) for name in ORDER}
        entries = list(
            src.execute(
                select(AuditEntry).where(AuditEntry.host_id == source.host).order_by(AuditEntry.id)
            ).scalars()
        )
        for name in NOT_COPIED:
            t = COVERED[name]
            result.not_copied[name] = int(
                src.execute(
                    select(func.count()).select_from(t).where(t.c.host_id == source.host)
                ).scalar_one()
            )
    with translated(target_engine), Session(bind=target_engine) as s, s.begin():
        if target_engine.dialect.name == "postgresql":  # the chain's lock, for the whole copy
            s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": audit.AUDIT_LOCK_KEY})
        if s.execute(select(Host.id).where(Host.name == host_name)).scalar() is not None:
            raise TargetHoldsHost(
                f"target {result.target} already holds host {host_name!r}: nothing was copied "
                "(a host's history is copied once, into a database that does not know it yet)",
                host=host_name,
                target=result.target,
            )
        last = s.execute(select(func.max(Host.id))).scalar()
        new_host = FIRST_HOST_ID if last is None else last + 1
        moved: dict[tuple[str, RowKey], tuple[RowKey, str]] = {}
        hosts = COVERED["hosts"]
        host_values.update(id=new_host, name=host_name)
        s.execute(insert(hosts).values(host_values))
        moved[("hosts", source.host)] = (new_host, row_digest(hosts, host_values))
        result.rows["hosts"] = 1
        # The source's rows under the new host, recording in `moved` (table, source key) ->
        # (target key, target digest).
        for name in ORDER:
            t = COVERED[name]
            (pk,) = t.primary_key.columns
            copied = 0
            for values in rows[name]:
                key = key_of(t, values)
                if name in SHARED:
                    if s.execute(select(pk).where(pk == key)).scalar() is None:
                        s.execute(insert(t).values(values))
                        moved[(name, key)] = (key, row_digest(t, values))
                        copied += 1
                    # else: another host stored this content first, and its entry covers that
                    # row; a row is covered once, so the copied entries leave it out
                    continue
                new = dict(values, host_id=new_host)
                if isinstance(key, int):
                    new.pop(pk.name)
                    new[pk.name] = s.execute(insert(t).values(new).returning(pk)).scalar_one()
                else:
                    s.execute(insert(t).values(new))
                moved[(name, key)] = (key_of(t, new), row_digest(t, new))
                copied += 1
            result.rows[name] = copied
        s.info[audit.HOST] = new_host
        for e in entries:
            refs = [(t, *moved[(t, k)]) for t, k, _d in json.loads(e.rows_json) if (t, k) in moved]
            payload = {**json.loads(e.payload_json), "copied": {"seq": e.id, "hash": e.hash}}
            audit.append(s, at=e.at, tx_id=e.tx_id, event=e.event, payload=payload, rows=refs)
            result.entries += 1
        audit.append(
            s,
            at=utcnow(),
            tx_id=None,
            event="db.copied",
            payload={
                "host": host_name,
                "source": result.source,
                "source_head": result.source_head,
                "rows": dict(result.rows),
                "not_copied": dict(result.not_copied),
            },
        )
        projection.write_rebuilt(s, new_host)
    return result
