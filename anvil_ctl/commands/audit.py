"""Read-only audit queries over the state database."""

from __future__ import annotations

from anvil_ctl.bootstrap import Context
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.validate import MAX_COUNT, check_int, parse_rfc3339, require, utc_stamp
from anvil_ctl.persistence import qualification, queries
from anvil_ctl.persistence import rechecks as recheck_rows
from anvil_ctl.persistence import verify as chain
from anvil_ctl.persistence.head import parse_head
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.persistence.queries import (
    DiffRecord,
    IdentityRecord,
    Revision,
    TransactionDetail,
    TransactionSummary,
)
from anvil_ctl.persistence.rechecks import RecheckRecord
from anvil_ctl.persistence.verify import ReportRecord


def transactions(
    ctx: Context,
    *,
    kind: str | None = None,
    state: str | None = None,
    since: str | None = None,
    limit: int = 50,
) -> list[TransactionSummary]:
    """The newest `limit` transactions; `since` an RFC 3339 date or date-time."""
    if since is not None:
        since = utc_stamp(require("--since", parse_rfc3339, since))
    limit = require("--limit", lambda n: check_int(n, lo=1, hi=MAX_COUNT), limit)
    return queries.transactions(ctx.store, kind=kind, state=state, since=since, limit=limit)


def _resolve(ctx: Context, tx: str) -> str:
    ids = queries.transaction_ids(ctx.store, tx)
    if len(ids) != 1:
        raise BadInput(
            f"transaction {tx!r}: {'no match' if not ids else 'ambiguous prefix'}",
            field="transaction",
        )
    return ids[0]


def show(ctx: Context, tx: str) -> TransactionDetail:
    return queries.transaction_detail(ctx.store, _resolve(ctx, tx))


def diff(ctx: Context, tx: str) -> list[DiffRecord]:
    return queries.snapshot_diffs(ctx.store, _resolve(ctx, tx))


def verify(ctx: Context, *, full: bool = False, expect_head: str | None = None) -> ReportRecord:
    """Verify the chain, every row it covers and its head (`persistence.verify`).

    Incremental from the last checkpoint unless `full`; `expect_head` (`SEQ:HASH`) is a
    head recorded elsewhere that the journal must still hold.
    """
    expected = parse_head(expect_head) if expect_head is not None else None
    return chain.verify(ctx.store, full=full, expect_head=expected).as_dict()


def identities(ctx: Context, *, slot: str | None = None, role: str = "incumbent") -> list[IdentityRecord]:
    """Which container served (or was recorded for) each slot, and from when."""
    return queries.identities(ctx.store, slot=slot, role=role)


def rechecks(ctx: Context, *, slot: str | None = None, limit: int = 50) -> list[RecheckRecord]:
    """The newest recheck results, newest first."""
    return recheck_rows.rechecks(ctx.store, slot=slot, limit=limit)


def decisions(ctx: Context, *, slot: str | None = None) -> list[DecisionRecord]:
    """Every qualify decision (and reclassification), oldest first."""
    return qualification.decisions(ctx.store, slot=slot)


def history(ctx: Context, *, slot: str, limit: int = 50) -> list[Revision]:
    """The slot's newest `limit` revisions, oldest first (`queries.slot_history`)."""
    limit = require("--limit", lambda n: check_int(n, lo=1, hi=MAX_COUNT), limit)
    rows = queries.slot_history(ctx.store, slot)
    if not rows:
        config = ctx.optional_config()
        if config is not None and slot not in config.slots:
            raise BadInput(
                f"slot {slot!r} is not in the host config and has no history; expected one of "
                f"{sorted(config.slots)}",
                field="slot",
            )
    return rows[-limit:]


def completion_ids(ctx: Context, what: str, prefix: str) -> list[tuple[str, str]]:
    """Recorded transaction or container IDs starting with `prefix`, for shell completion."""
    return queries.recent_ids(ctx.store, what, prefix)
