"""The serve lifecycle after a load: promote, rollback (and its other name, restore), recheck, reconcile."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.complete import complete_containers, complete_targets
from anvil_ctl.cli.options import (
    WAIT_TIMEOUT_HELP,
    accept_drift_options,
    drain_options,
    drift_acceptance,
    dry_run_option,
    slot_option,
    timeout_option,
)
from anvil_ctl.cli.params import PERSON, REASON, REF, SINCE, TEXTFILE, TIMEOUT, WATCH, check_new_file
from anvil_ctl.cli.session import Lazy, Reply, Session, command
from anvil_ctl.core.model import OnDrainTimeout
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.commands import lifecycle, transactions
    from anvil_ctl.commands import recheck as recheck_cmd
else:
    lifecycle = Lazy("anvil_ctl.commands.lifecycle")
    recheck_cmd = Lazy("anvil_ctl.commands.recheck")
    transactions = Lazy("anvil_ctl.commands.transactions")


@command("promote", "anvilctl promote --slot primary --approved-by alice --dry-run")
@click.argument("candidate", type=REF, required=False, shell_complete=complete_containers)
@slot_option("The slot to promote in.", default="primary")
@click.option("--approved-by", type=PERSON, help="The person approving this promotion (required).")
@click.option(
    "--watch",
    "watch_s",
    type=WATCH,
    metavar="DURATION",
    help="After the switch, watch the serve this long through the route against the [watch] "
    "thresholds of the profile that qualified it; a breach rolls back by itself (exit 10). "
    "0: a cutover. Default: that profile's watch.duration (none declared: a cutover).",
)
@click.option(
    "--abort",
    is_flag=True,
    help="Stop the watch of the slot's promote running in another shell: it rolls back, "
    "recorded as your decision (--by NAME --reason TEXT, as with --accept-drift).",
)
@click.option(
    "--canary",
    "shares",
    metavar="SHARES",
    default=None,
    help="Step the candidate's share of the tier's requests, e.g. 10,50,100, beside the incumbent "
    "another slot of the tier serves; each step watched side by side; a breach returns every "
    "request to the incumbent. Needs a router that weighs (HAProxy).",
)
@click.option(
    "--step-watch",
    "step_watch_s",
    type=TIMEOUT,
    default=None,
    help="How long each canary step is watched (e.g. 5m).",
)
@click.option(
    "--profile",
    default=None,
    help="The profile whose [watch] thresholds judge the canary (default: the candidate's decision's).",
)
@dry_run_option()
@timeout_option(WAIT_TIMEOUT_HELP)
@accept_drift_options
def promote(
    session: Session,
    *,
    candidate: str | None,
    slot: str,
    approved_by: str | None,
    watch_s: float | None,
    abort: bool,
    shares: str | None,
    step_watch_s: float | None,
    profile: str | None,
    dry_run: bool,
    timeout_s: float | None,
    accept_drift: bool,
    drift_by: str | None,
    drift_reason: str | None,
) -> Reply:
    """Route the slot to its verified candidate.

    The candidate becomes the incumbent; the old incumbent stays stopped and
    becomes the rollback identity. CANDIDATE (optional) names the loaded candidate
    to expect: a container ID prefix, its served model or its identity digest.

    With --watch the promote stays open (state `watching`) and samples the new
    incumbent through the route at the profile's interval: streamed chats with the
    official client (time to first token, decode rate, errors, finish_reason) and
    its container (restarts, OOM, running, fatal log lines since the switch). The
    limits are resolved and journaled before the first sample. A healthy watch
    commits (exit 0). A breach, `promote --abort` from another shell, or Ctrl-C
    ends it `rolled_back` and a rollback of its own brings the old incumbent back
    (exit 10; the rollback's own code if it did not commit).
    """
    if abort:
        if drift_by is None or drift_reason is None:
            raise click.UsageError("--abort needs --by NAME and --reason TEXT")
        return Reply(lifecycle.abort_watch(session.app(), slot=slot, by=drift_by, reason=drift_reason))
    if approved_by is None:
        raise click.UsageError("Missing option '--approved-by'.")
    if shares is not None or step_watch_s is not None:
        if shares is None or step_watch_s is None:
            raise click.UsageError("--canary and --step-watch go together")
        if candidate is not None or accept_drift or watch_s is not None:
            raise click.UsageError(
                "--canary promotes the slot's loaded candidate: no CANDIDATE, --accept-drift or --watch"
            )
        out = lifecycle.canary(
            session.app(),
            slot=slot,
            approved_by=approved_by,
            shares=shares,
            step_watch_s=step_watch_s,
            profile=profile,
            dry_run=dry_run,
            timeout_s=timeout_s,
        )
        return Reply(out, ExitCode(out.exit_code))
    if profile is not None:
        raise click.UsageError("--profile goes with --canary")
    out = lifecycle.promote(
        session.app(),
        slot=slot,
        approved_by=approved_by,
        candidate=candidate,
        dry_run=dry_run,
        accept_drift=drift_acceptance(accept_drift, drift_by, drift_reason),
        timeout_s=timeout_s,
        watch_s=watch_s,
    )
    return Reply(out, ExitCode(out.exit_code))


def _rollback_command(name: str, summary: str) -> click.Command:
    """`rollback` and `restore`: one command under two names (the README uses both)."""
    help_text = (
        f"{summary}\n\nDrain what serves now (no new requests; the answers in flight finish, "
        "at most --drain-timeout: at it a rollback goes on and counts the answers it cut), stop "
        "(and keep) it, start the same container ID of the target, "
        "check health and identity, route back; commit only if the identity-critical fields "
        "equal the recorded ones. `rollback` and `restore` are the same command."
    )

    @command(name, f"anvilctl {name} --slot primary --to 3 --dry-run", help=help_text)
    @slot_option("The slot to restore.", default="primary")
    @click.option(
        "--to",
        type=REF,
        shell_complete=complete_targets,
        metavar="REVISION|TX|CONTAINER",
        help="What to bring back: a revision of `audit history --slot` (3), the serve a "
        "transaction left (ID prefix, 8+ characters), a container ID prefix, an identity "
        "digest or a served model.",
    )
    @click.option(
        "--restore-group",
        type=REF,
        metavar="GROUP",
        help="A restore group of the host config; it must contain the target.",
    )
    @dry_run_option()
    @timeout_option(WAIT_TIMEOUT_HELP)
    @drain_options("cut")
    def run(
        session: Session,
        *,
        slot: str,
        to: str | None,
        restore_group: str | None,
        dry_run: bool,
        timeout_s: float | None,
        drain_timeout_s: float | None,
        on_drain_timeout: OnDrainTimeout | None,
    ) -> Reply:
        out = lifecycle.rollback(
            session.app(),
            slot=slot,
            to=to,
            restore_group=restore_group,
            dry_run=dry_run,
            timeout_s=timeout_s,
            drain_timeout_s=drain_timeout_s,
            on_drain_timeout=on_drain_timeout,
        )
        return Reply(out, ExitCode(out.exit_code))

    return run


rollback = _rollback_command(
    "rollback", "Bring a recorded identity back exactly.\n\nBy default the slot's rollback identity."
)
restore = _rollback_command("restore", "Bring the recorded incumbent back exactly.\n\nrollback's other name.")


@command("recheck", "anvilctl recheck --slot primary --textfile /var/lib/node_exporter/textfile/anvil.prom")
@slot_option("The slot to recheck.", default="primary")
@click.option(
    "--textfile",
    type=TEXTFILE,
    metavar="FILE",
    help="Also write node_exporter textfile metrics to this file (atomically).",
)
@click.option(
    "--repair",
    type=click.Choice(["router"]),
    multiple=True,
    help="Run this safe repair when only it would fix the drift: router re-applies the recorded "
    "route of the running, healthy incumbent (a `reconcile` transaction).",
)
@click.option(
    "--slo",
    is_flag=True,
    help="Also sample the route with the official client against the serve's [watch] thresholds "
    "(the profile that qualified it); a breach fails the `slo` assertion.",
)
@click.option("--profile", type=REF, metavar="P", help="With --slo: take the thresholds from this profile.")
@click.option(
    "--rollback-on-breach",
    is_flag=True,
    help="With --slo: on a breach, roll back to the recorded rollback identity; needs --by and --until.",
)
@click.option("--by", type=PERSON, metavar="NAME", help="Who enabled --rollback-on-breach (recorded).")
@click.option("--until", type=SINCE, metavar="TIME", help="--rollback-on-breach is in force until then.")
@click.option("--reason", type=REASON, help="Why --rollback-on-breach is enabled (recorded).")
@click.option(
    "--wait-router",
    type=TIMEOUT,
    metavar="DURATION",
    help="First wait up to DURATION for the router to answer (a router's start hook: "
    "contrib/systemd, contrib/anvil-router-watch); exit 7 if it does not.",
)
def recheck(
    session: Session,
    *,
    slot: str,
    textfile: Path | None,
    repair: tuple[str, ...],
    slo: bool,
    profile: str | None,
    rollback_on_breach: bool,
    by: str | None,
    until: str | None,
    reason: str | None,
    wait_router: float | None,
) -> Reply:
    """Goal-closure assertions; exit 6 on drift.

    For cron or a systemd timer; every run is recorded. Read-only unless --repair
    names a repair: then the route alone is re-applied when it is what drifted. Exit 7
    when the host cannot be observed (Docker or the state database unavailable): the
    textfile then says anvil_recheck_up 0. Between a committed load and its promote or
    rollback the slot is judged as the campaign should be (phase qualifying); while a
    promote watches, as the watch should hold (phase watching; exit 5 if its owner is gone);
    the slot of a canary's pair that does not serve the tier, as standing by (phase standby).
    """
    if textfile is not None:
        check_new_file(textfile, "--textfile")  # before anything is observed or recorded
    if (profile or rollback_on_breach) and not slo:
        raise click.UsageError("--profile and --rollback-on-breach go with --slo")
    if rollback_on_breach != bool(by and until and reason) or (
        not rollback_on_breach and (by or until or reason)
    ):
        raise click.UsageError(
            "--rollback-on-breach needs --by NAME, --until TIME and --reason TEXT (and they need it)"
        )
    with session.working(f"recheck: observing slot {slot} and checking its goals") as app:
        request = None
        if slo:
            from anvil_ctl.commands.slo import Enablement
            from anvil_ctl.core.validate import parse_rfc3339

            enabled = Enablement(by, parse_rfc3339(until), reason) if by and until and reason else None
            request = recheck_cmd.SloRequest(profile=profile, rollback_on_breach=enabled)
        result = recheck_cmd.recheck(app, slot, repair=repair, slo=request, wait_router_s=wait_router)
    if textfile is not None:
        recheck_cmd.write_textfile(textfile, result, now=time.time())
    return Reply(result, ExitCode(result.exit_code))


@command("reconcile", "anvilctl reconcile --slot primary --dry-run")
@slot_option("The slot whose recorded route to re-apply.", default="primary")
@dry_run_option()
def reconcile(session: Session, slot: str, dry_run: bool) -> Reply:
    """Re-apply the recorded route of the slot's running incumbent.

    Journaled and idempotent: when the route holds nothing changes. Refused unless
    the recorded incumbent is the container running and serving at the binding
    (a loaded, unpromoted candidate is never routed: that is promote's job).
    """
    out = transactions.reconcile(session.app(), slot, dry_run=dry_run)
    return Reply(out, ExitCode(out.exit_code))
