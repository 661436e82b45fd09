"""`anvilctl audit ...`: read-only views of the state database: its journal, chain and records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.complete import complete_transactions
from anvil_ctl.cli.options import host_options, host_scope, limit_option, slot_option
from anvil_ctl.cli.params import REF, SINCE
from anvil_ctl.cli.session import Lazy, Reply, Session, command, group
from anvil_ctl.core.states import IDENTITY_ROLES, TX_KINDS, ExitCode, TxState

if TYPE_CHECKING:
    from anvil_ctl.cli import views
    from anvil_ctl.commands import audit as audit_cmd
    from anvil_ctl.commands import evidence as evidence_cmd
    from anvil_ctl.commands import gpus_and_waivers
else:
    views = Lazy("anvil_ctl.cli.views")
    audit_cmd = Lazy("anvil_ctl.commands.audit")
    evidence_cmd = Lazy("anvil_ctl.commands.evidence")
    gpus_and_waivers = Lazy("anvil_ctl.commands.gpus_and_waivers")


only_slot = slot_option("Only this slot.")


@command("transactions", "anvilctl audit transactions --state committed --kind load --limit 10")
@click.option(
    "--kind",
    type=click.Choice(TX_KINDS),
    metavar="KIND",
    help=f"Only transactions of this kind: {', '.join(TX_KINDS)}.",
)
@click.option(
    "--state",
    type=click.Choice([s.value for s in TxState]),
    metavar="STATE",
    help=f"Only those now in this state: {', '.join(s.value for s in TxState)}.",
)
@click.option(
    "--since",
    type=SINCE,
    metavar="TIME",
    help="Only those created at or after this RFC 3339 date or date-time (UTC without an offset).",
)
@limit_option("transactions")
@host_options
def transactions(
    session: Session,
    *,
    kind: str | None,
    state: str | None,
    since: str | None,
    limit: int,
    host: str | None,
    all_hosts: bool,
) -> Reply:
    """List transactions with their current state and reason (this host's, unless --host or
    --all-hosts)."""
    rows = audit_cmd.transactions(
        session.app(), kind=kind, state=state, since=since, limit=limit, scope=host_scope(host, all_hosts)
    )
    return Reply(views.Table(rows))


@command("show", "anvilctl audit show 8259c0de")
@click.argument("tx", type=REF, shell_complete=complete_transactions)
@host_options
def show(session: Session, tx: str, host: str | None, all_hosts: bool) -> Reply:
    """One transaction (ID or unique prefix) as a timeline of states and steps with durations.

    --json prints every journal row with its detail."""
    return Reply(views.TransactionView(audit_cmd.show(session.app(), tx, host_scope(host, all_hosts))))


@command("diff", "anvilctl audit diff 8259c0de")
@click.argument("tx", type=REF, shell_complete=complete_transactions)
@host_options
def diff(session: Session, tx: str, host: str | None, all_hosts: bool) -> Reply:
    """A transaction's recorded snapshot diffs; TX is an ID or unique prefix."""
    return Reply(views.DiffView(audit_cmd.diff(session.app(), tx, host_scope(host, all_hosts))))


@command("history", "anvilctl audit history --slot primary")
@slot_option("The slot whose revisions to list.", required=True)
@limit_option("revisions")
def history(session: Session, slot: str, limit: int) -> Reply:
    """A slot's revisions, numbered as `rollback --to REVISION` takes them (helm history).

    Every adopt, load, promote and rollback that ran is a revision (refusals are not); a
    committed one names the serve it left. Oldest first; --limit keeps the newest."""
    revisions = audit_cmd.history(session.app(), slot=slot, limit=limit)
    return Reply(views.Table(revisions, cells=_revision_cells))


def _revision_cells(r: Mapping[str, object]) -> Mapping[str, object]:
    """A revision as `helm history` shows it: the serve it left, its reason as its description."""
    serve = views.record(r.get("serve"))
    return {
        "revision": r["revision"],
        "updated": r["created_at"],
        "kind": r["kind"],
        "state": r["state"],
        "container": serve.get("container_id") or "",
        "served_model": serve.get("served_model") or "",
        "tx_id": r["tx_id"],
        "description": r.get("reason") or "",
    }


@command("verify", "anvilctl audit verify --expect-head 1742:9f2c...e01a")
@click.option(
    "--full",
    is_flag=True,
    help="Walk the whole journal and re-digest every row, not only what came after the last checkpoint.",
)
@click.option(
    "--expect-head",
    metavar="SEQ:HASH",
    help="A head recorded elsewhere (recheck textfile, logs, an earlier verify): the journal must hold it.",
)
@host_options
def verify(session: Session, full: bool, expect_head: str | None, host: str | None, all_hosts: bool) -> Reply:
    """Verify the audit journal and every row it covers (exit 6 on a break).

    Walks the hash chain, re-digests every covered row and compares the head with the head
    file: names any edited, deleted, inserted or reordered entry or row and a cut tail.
    Incremental from the last clean checkpoint unless --full. A fleet shares one chain;
    --host and --all-hosts choose whose entries the report counts."""
    walk = "the whole journal" if full else "the journal from the last checkpoint"
    with session.working(f"audit verify: walking {walk} and re-digesting the rows it covers") as app:
        check = views.ChainCheck(
            audit_cmd.verify(app, full=full, expect_head=expect_head, scope=host_scope(host, all_hosts))
        )
    return Reply(check, ExitCode.OK if check.ok else ExitCode.DRIFT)


@command("incumbents", "anvilctl audit incumbents --slot primary")
@only_slot
@click.option(
    "--role",
    type=click.Choice(IDENTITY_ROLES),
    default="incumbent",
    show_default=True,
    help="List the identities recorded under this role instead.",
)
@limit_option("identities")
@host_options
def incumbents(
    session: Session, *, slot: str | None, role: str, limit: int, host: str | None, all_hosts: bool
) -> Reply:
    """Which container was each slot's incumbent, and when (oldest first; --role for others)."""
    rows = audit_cmd.identities(
        session.app(), slot=slot, role=role, scope=host_scope(host, all_hosts), limit=limit
    )
    if host is None and not all_hosts and rows:  # one host's: its name in --json only
        return Reply(views.Table(rows, columns=[c for c in rows[0] if c != "host"]))
    return Reply(views.Table(rows))


@command("served", "anvilctl audit served --slot primary --at 2026-09-02T12:00:00Z --all-hosts")
@slot_option("The slot.", required=True)
@click.option(
    "--at",
    "at",
    type=SINCE,
    required=True,
    metavar="TIME",
    help="The moment: an RFC 3339 date or date-time (UTC without an offset).",
)
@host_options
def served(session: Session, slot: str, at: str, host: str | None, all_hosts: bool) -> Reply:
    """Which container served SLOT at TIME: this host's, --host NAME's, or every host's.

    The incumbent a committed transaction left, until the next one's (v_serving_history)."""
    return Reply(
        views.Table(audit_cmd.served(session.app(), slot=slot, at=at, scope=host_scope(host, all_hosts)))
    )


def _decision_cells(r: Mapping[str, object]) -> Mapping[str, object]:
    """A decision as one readable line: IDs and digests shortened, waivers joined."""
    return {
        "decision": str(r["id"])[:16],
        "at": str(r["at"])[:19],
        "slot": r.get("slot"),
        "outcome": r["outcome"],
        "reclassifies": str(r["reclassifies"] or "")[:16],
        "waivers": ",".join(str(w) for w in views.items(r["waiver_ids"])),
        "profile": r["profile"],
        "identity": str(r["identity_digest"])[:12],
    }


@command("decisions", "anvilctl audit decisions --slot primary --limit 10")
@only_slot
@limit_option("decisions")
def decisions(session: Session, slot: str | None, limit: int) -> Reply:
    """Qualification decisions, reclassifications included (oldest first; --json: every field)."""
    decided = evidence_cmd.audit_decisions(session.app(), slot=slot, limit=limit)
    return Reply(views.Table(decided, cells=_decision_cells))


@command("waivers", "anvilctl audit waivers --json")
def waivers(session: Session) -> Reply:
    """Every waiver with its state now (= waivers list)."""
    return Reply(views.waiver_table(gpus_and_waivers.list_waivers(session.app())))


@command("rechecks", "anvilctl audit rechecks --slot primary --limit 5")
@only_slot
@limit_option("recheck runs")
def rechecks(session: Session, slot: str | None, limit: int) -> Reply:
    """Recorded recheck runs: pass/fail and the failed assertions."""
    return Reply(views.Table(audit_cmd.rechecks(session.app(), slot=slot, limit=limit)))


@command("evidence", "anvilctl audit evidence 8259c0de")
@click.argument("tx", type=REF, shell_complete=complete_transactions)
def evidence(session: Session, tx: str) -> Reply:
    """A transaction's gate rows, and its evidence directory checked against its manifest (exit 6)."""
    found = views.EvidenceAudit(evidence_cmd.audit_evidence(session.app(), tx))
    return Reply(found, ExitCode.OK if found.ok else ExitCode.DRIFT)


audit = group(
    "audit",
    "Read the state database: journal, hash chain, records.",
    "anvilctl audit transactions --json",
    transactions,
    history,
    show,
    diff,
    verify,
    incumbents,
    served,
    decisions,
    waivers,
    rechecks,
    evidence,
)
