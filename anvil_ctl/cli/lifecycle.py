"""The serve lifecycle after a load: promote, rollback (and its other name, restore), recheck, reconcile."""

from __future__ import annotations

import time
from pathlib import Path

import click

from anvil_ctl.cli.complete import complete_containers, complete_slots, complete_targets
from anvil_ctl.cli.params import PERSON, REF, TEXTFILE, check_new_file
from anvil_ctl.cli.session import (
    WAIT_TIMEOUT_HELP,
    Reply,
    Session,
    accept_drift_options,
    drift_acceptance,
    example,
    pass_session,
    timeout_option,
)
from anvil_ctl.core.states import ExitCode


@click.command("promote", epilog=example("anvilctl promote --slot primary --approved-by alice --dry-run"))
@click.argument("candidate", type=REF, required=False, shell_complete=complete_containers)
@click.option(
    "--slot",
    type=REF,
    default="primary",
    show_default=True,
    shell_complete=complete_slots,
    metavar="SLOT",
    help="The slot to promote in.",
)
@click.option("--approved-by", type=PERSON, required=True, help="The person approving this promotion.")
@click.option("--dry-run", is_flag=True, help="Run every guard and print the plan; change nothing.")
@timeout_option(WAIT_TIMEOUT_HELP)
@accept_drift_options
@pass_session
def promote(
    session: Session,
    *,
    candidate: str | None,
    slot: str,
    approved_by: str,
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
    """
    from anvil_ctl.commands import lifecycle

    out = lifecycle.promote(
        session.app(),
        slot=slot,
        approved_by=approved_by,
        candidate=candidate,
        dry_run=dry_run,
        accept_drift=drift_acceptance(accept_drift, drift_by, drift_reason),
        timeout_s=timeout_s,
    )
    return Reply(out, ExitCode(out.exit_code))


def _rollback_command(name: str, summary: str) -> click.Command:
    """`rollback` and `restore`: one command under two names (the README uses both)."""

    @click.command(name, epilog=example(f"anvilctl {name} --slot primary --to 3 --dry-run"))
    @click.option(
        "--slot",
        type=REF,
        default="primary",
        show_default=True,
        shell_complete=complete_slots,
        metavar="SLOT",
        help="The slot to restore.",
    )
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
    @click.option("--dry-run", is_flag=True, help="Run every guard and print the plan; change nothing.")
    @timeout_option(WAIT_TIMEOUT_HELP)
    @pass_session
    def command(
        session: Session,
        *,
        slot: str,
        to: str | None,
        restore_group: str | None,
        dry_run: bool,
        timeout_s: float | None,
    ) -> Reply:
        from anvil_ctl.commands import lifecycle

        out = lifecycle.rollback(
            session.app(),
            slot=slot,
            to=to,
            restore_group=restore_group,
            dry_run=dry_run,
            timeout_s=timeout_s,
        )
        return Reply(out, ExitCode(out.exit_code))

    command.help = (
        f"{summary}\n\nStop (and keep) what serves now, start the same container ID of the target, "
        "check health and identity, route back; commit only if the identity-critical fields "
        "equal the recorded ones. `rollback` and `restore` are the same command."
    )
    return command


rollback = _rollback_command(
    "rollback", "Bring a recorded identity back exactly.\n\nBy default the slot's rollback identity."
)
restore = _rollback_command("restore", "Bring the recorded incumbent back exactly.\n\nrollback's other name.")


@click.command(
    "recheck",
    epilog=example("anvilctl recheck --slot primary --textfile /var/lib/node_exporter/textfile/anvil.prom"),
)
@click.option(
    "--slot",
    type=REF,
    default="primary",
    show_default=True,
    shell_complete=complete_slots,
    metavar="SLOT",
    help="The slot to recheck.",
)
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
@pass_session
def recheck(session: Session, slot: str, textfile: Path | None, repair: tuple[str, ...]) -> Reply:
    """Goal-closure assertions; exit 6 on drift.

    For cron or a systemd timer; every run is recorded. Read-only unless --repair
    names a repair: then the route alone is re-applied when it is what drifted. Exit 7
    when the host cannot be observed (Docker or the state database unavailable): the
    textfile then says anvil_recheck_up 0.
    """
    from anvil_ctl.cli.progress import working

    if textfile is not None:
        check_new_file(textfile, "--textfile")  # before anything is observed or recorded
    app = session.app()
    with working(app.progress, f"recheck: observing slot {slot} and checking its goals"):
        from anvil_ctl.commands import recheck as recheck_cmd

        result = recheck_cmd.recheck(app, slot, repair=repair)
    if textfile is not None:
        recheck_cmd.write_textfile(textfile, result, now=time.time())
    return Reply(result, ExitCode(result.exit_code))


@click.command("reconcile", epilog=example("anvilctl reconcile --slot primary --dry-run"))
@click.option(
    "--slot",
    default="primary",
    show_default=True,
    shell_complete=complete_slots,
    metavar="SLOT",
    help="The slot whose recorded route to re-apply.",
)
@click.option("--dry-run", is_flag=True, help="Run every guard and print the plan; change nothing.")
@pass_session
def reconcile(session: Session, slot: str, dry_run: bool) -> Reply:
    """Re-apply the recorded route of the slot's running incumbent.

    Journaled and idempotent: when the route holds nothing changes. Refused unless
    the recorded incumbent is the container running and serving at the binding
    (a loaded, unpromoted candidate is never routed: that is promote's job).
    """
    from anvil_ctl.commands import reconcile as reconcile_cmd

    out = reconcile_cmd.reconcile(session.app(), slot, dry_run=dry_run)
    return Reply(out, ExitCode(out.exit_code))
