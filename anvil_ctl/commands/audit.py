"""Read-only audit queries over the state database."""

from __future__ import annotations

from dataclasses import dataclass

from anvil_ctl.bootstrap import App
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.validate import check_text, parse_rfc3339, require, require_limit, utc_stamp
from anvil_ctl.persistence import hosts, queries
from anvil_ctl.persistence import rechecks as recheck_rows
from anvil_ctl.persistence import verify as chain
from anvil_ctl.persistence.head import parse_head
from anvil_ctl.persistence.queries import Revision, TransactionDetail, TransactionSummary
from anvil_ctl.persistence.rechecks import RecheckRecord


def check_name(value: str) -> str:
    return check_text(value, max_len=64, empty=False)


@dataclass(frozen=True)
class HostScope:
    """Which hosts an audit query answers for: `--host NAME` (default: this host) or `--all-hosts`."""

    host: str | None = None
    all_hosts: bool = False


THIS_HOST = HostScope()


def host_id(app: App, scope: HostScope) -> int | None:
    """The host a query is scoped to, None for every host; BadInput for an unknown name."""
    if scope.all_hosts:
        if scope.host is not None:
            raise BadInput("--host and --all-hosts: give one of them", field="--host")
        return None
    if scope.host is None:
        return app.store.host
    name = require("--host", check_name, scope.host)
    found = hosts.by_name(app.store, name)
    if found is None:
        known = [h.name for h in hosts.all_hosts(app.store)]
        raise BadInput(
            f"--host {name!r}: no such host in the state database; expected one of {known}", field="--host"
        )
    return found.id


def transactions(
    app: App,
    *,
    kind: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 50,
    scope: HostScope = THIS_HOST,
) -> list[TransactionSummary]:
    """The newest `limit` transactions; `since` an RFC 3339 date or date-time."""
    if since is not None:
        since = utc_stamp(require("--since", parse_rfc3339, since))
    limit = require_limit(limit)
    host = host_id(app, scope)
    return queries.transactions(app.store, kind=kind, state=state, since=since, limit=limit, host=host)


def _resolve(app: App, tx: str, scope: HostScope = THIS_HOST) -> str:
    ids = queries.transaction_ids(app.store, tx, host_id(app, scope))
    if len(ids) != 1:
        raise BadInput(
            f"transaction {tx!r}: {'no match' if not ids else 'ambiguous prefix'}",
            field="transaction",
        )
    return ids[0]


def show(app: App, tx: str, scope: HostScope = THIS_HOST) -> TransactionDetail:
    return queries.transaction_detail(app.store, _resolve(app, tx, scope))


def diff(app: App, tx: str, scope: HostScope = THIS_HOST) -> list[JSONObject]:
    return queries.snapshot_diffs(app.store, _resolve(app, tx, scope))


def verify(
    app: App, *, full: bool = False, expect_head: str | None = None, scope: HostScope = THIS_HOST
) -> JSONObject:
    """Verify the chain, every row it covers and its head (`persistence.verify`): incremental from
    the last checkpoint unless `full`; `expect_head` (`SEQ:HASH`) must still be held. The chain is
    the fleet's; `scope` picks the hosts whose entries the report counts."""
    expected = parse_head(expect_head) if expect_head is not None else None
    host = host_id(app, scope)
    report = chain.verify(app.store, full=full, expect_head=expected).as_dict()
    report["hosts"] = list[JSONValue](chain.host_counts(app.store, host))
    return report


def identities(
    app: App,
    *,
    slot: str | None = None,
    role: str = "incumbent",
    scope: HostScope = THIS_HOST,
    limit: int = 50,
) -> list[JSONObject]:
    """Which container served (or was recorded for) each slot, and from when: the newest
    `limit` recorded, oldest first."""
    limit = require_limit(limit)
    return queries.identities(app.store, slot=slot, role=role, host=host_id(app, scope), limit=limit)


def served(app: App, *, slot: str, at: str, scope: HostScope = THIS_HOST) -> list[JSONObject]:
    """Which container served `slot` at time `at` (RFC 3339), on one host or on every host."""
    slot = require("--slot", check_name, slot)
    when = utc_stamp(require("--at", parse_rfc3339, at))
    return queries.served_at(app.store, slot=slot, at=when, host=host_id(app, scope))


def fleet_status(app: App) -> list[JSONObject]:
    """Every host registered in the state database: its incumbents, last recheck, unresolved
    transactions and held locks (`anvilctl fleet status`)."""
    return hosts.status(app.store)


def rechecks(app: App, *, slot: str | None = None, limit: int = 50) -> list[RecheckRecord]:
    """The newest recheck results, newest first."""
    return recheck_rows.rechecks(app.store, slot=slot, limit=limit)


def history(app: App, *, slot: str, limit: int = 50) -> list[Revision]:
    """The slot's newest `limit` revisions, oldest first (`queries.slot_revisions`)."""
    limit = require_limit(limit)
    _, rows = queries.slot_revisions(app.store, slot, app.store.host, newest=limit)
    if not rows:
        config = app.optional_config()
        if config is not None and slot not in config.slots:
            raise BadInput(
                f"slot {slot!r} is not in the host config and has no history; expected one of "
                f"{sorted(config.slots)}",
                field="slot",
            )
    return rows


def completion_ids(app: App, what: str, prefix: str) -> list[tuple[str, str]]:
    """Recorded transaction or container IDs starting with `prefix`, for shell completion."""
    return queries.recent_ids(app.store, what, prefix)
