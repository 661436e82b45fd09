"""The options several commands share, each written once. Light: every `--help` imports it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

from anvil_ctl.cli.complete import complete_slots
from anvil_ctl.cli.params import LIMIT, PERSON, REASON, REF, TIMEOUT

if TYPE_CHECKING:
    from anvil_ctl.commands.audit import HostScope
    from anvil_ctl.engine.plans.args import DriftAcceptance

F = TypeVar("F", bound=Callable[..., object])


def slot_option(help: str, *, default: str | None = None, required: bool = False) -> Callable[[F], F]:
    """`--slot SLOT`: a slot of the host config, completed from it."""
    # default=None is a value to click (a required option would take it): only a real one is given
    given = {"default": default, "show_default": True} if default is not None else {"required": required}
    return click.option("--slot", type=REF, shell_complete=complete_slots, metavar="SLOT", help=help, **given)


def dry_run_option(help: str = "Run every guard and print the plan; change nothing.") -> Callable[[F], F]:
    return click.option("--dry-run", is_flag=True, help=help)


def timeout_option(what: str) -> Callable[[F], F]:
    """`--timeout DURATION` of load, promote, rollback and qualify (kubectl and helm spelling)."""
    return click.option("--timeout", "timeout_s", type=TIMEOUT, metavar="DURATION", help=what)


def drain_options(default: str) -> Callable[[F], F]:
    """`--drain-timeout DURATION --on-drain-timeout abort|cut` (`default`: the policy at the deadline)."""

    def add(fn: F) -> F:
        fn = click.option(
            "--on-drain-timeout",
            type=click.Choice(["abort", "cut"]),
            help="At the drain's deadline: abort (compensate; the serve stays routed; exit 3) or "
            f"cut (stop it anyway; the cut answers are counted in the record). Default: {default}.",
        )(fn)
        return click.option(
            "--drain-timeout",
            "drain_timeout_s",
            type=TIMEOUT,
            metavar="DURATION",
            help="Longest wait for the answers in flight on the serve taken out of traffic "
            "(e.g. 5m); default: the recipe's drain_timeout_s, else 300s.",
        )(fn)

    return add


WAIT_TIMEOUT_HELP = (
    "Longest any one wait may last (health, VRAM release, readmission), e.g. 90s, 5m; default: "
    "the recipe's and the host config's deadlines. Compensation keeps those, never this."
)

override_option = click.option(
    "--override",
    multiple=True,
    type=REF,
    metavar="UUID=ROLE",
    help="Name the GPU with this UUID ROLE instead of compute-a, compute-b, ... (repeatable).",
)


def accept_drift_options(fn: F) -> F:
    """`--accept-drift --by NAME --reason TEXT`: a person's decision to mutate a drifted host."""
    fn = click.option(
        "--reason",
        "drift_reason",
        type=REASON,
        metavar="TEXT",
        help="With --accept-drift: why it is safe to go on (promote --abort: why to stop).",
    )(fn)
    fn = click.option(
        "--by",
        "drift_by",
        type=PERSON,
        metavar="NAME",
        help="With --accept-drift: the person accepting the drift (promote --abort: stopping).",
    )(fn)
    return click.option(
        "--accept-drift",
        is_flag=True,
        help="Go on although the slot differs from its record (recorded with --by and --reason).",
    )(fn)


def drift_acceptance(accept: bool, by: str | None, reason: str | None) -> DriftAcceptance | None:
    """The journaled DriftAcceptance, or None; both --by and --reason are required with it."""
    if not accept:
        if by or reason:
            raise click.UsageError("--by and --reason go with --accept-drift")
        return None
    if not (by and by.strip()) or not (reason and reason.strip()):
        raise click.UsageError("--accept-drift needs --by NAME and --reason TEXT")
    from anvil_ctl.engine.plans.args import DriftAcceptance

    return DriftAcceptance(by=by.strip(), reason=reason.strip())


def host_options(fn: F) -> F:
    """`--host NAME` and `--all-hosts`: which hosts of the fleet a listing answers for."""
    fn = click.option(
        "--all-hosts", is_flag=True, help="Every host of the fleet sharing this state database."
    )(fn)
    return click.option(
        "--host", "host", type=REF, metavar="NAME", help="This host of the fleet instead of this one."
    )(fn)


def host_scope(host: str | None, all_hosts: bool) -> HostScope:
    from anvil_ctl.commands.audit import HostScope

    return HostScope(host=host, all_hosts=all_hosts)


def limit_option(what: str) -> Callable[[F], F]:
    return click.option(
        "--limit", type=LIMIT, default=50, show_default=True, help=f"At most this many {what}: the newest."
    )
