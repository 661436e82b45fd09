"""GPUs and waivers: gpus, gpus detect, waive, waivers list|revoke."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.options import override_option
from anvil_ctl.cli.params import MIB, PERSON, REASON, REF, text
from anvil_ctl.cli.session import Lazy, Reply, Session, command, example, group, pass_session
from anvil_ctl.core.waiver import POLICIES  # the light module: `--help` stays fast

if TYPE_CHECKING:
    from anvil_ctl.cli import views
    from anvil_ctl.commands import gpus_and_waivers
else:
    views = Lazy("anvil_ctl.cli.views")
    gpus_and_waivers = Lazy("anvil_ctl.commands.gpus_and_waivers")


@command("detect", "anvilctl gpus detect --override GPU-0123abcd=big --write")
@override_option
@click.option(
    "--write",
    is_flag=True,
    help="Write the [gpu_roles.*] tables into the host config (the rest of the file is kept).",
)
def gpus_detect(session: Session, override: tuple[str, ...], write: bool) -> Reply:
    """Name the GPUs as host-config roles, largest first: [gpu_roles.*] TOML (--write: into the config)."""
    result = gpus_and_waivers.detect(
        session.app(), overrides=gpus_and_waivers.parse_overrides(override), write=write
    )
    return Reply(views.DetectedRoles(result))


@pass_session
def _gpus(session: Session) -> Reply | None:
    """GPU readings by UUID, with role and owner (--json: every field)."""
    if click.get_current_context().invoked_subcommand is not None:
        return None  # `gpus detect`: the subcommand answers

    return Reply(views.GpuReadings(gpus_and_waivers.readings(session.app())))


gpus = click.Group(
    "gpus",
    commands=[gpus_detect],
    callback=_gpus,
    invoke_without_command=True,
    help="GPU readings by UUID, with role and owner (--json: every field).",
    epilog=example("anvilctl gpus --json"),
)


@command(
    "waive",
    "anvilctl waive --policy vram-reserve --scope compute-a,compute-b --value 0 "
    '--approved-by alice --reason "model-only GPU pair" --expires 2026-12-31',
)
@click.option("--policy", required=True, type=click.Choice(POLICIES), help="The policy to waive.")
@click.option(
    "--scope",
    type=text(1024),
    required=True,
    metavar="ROLES|DIGEST",
    help="GPU roles (compute-a,compute-b) or a recipe digest (64 hex, optional sha256:).",
)
@click.option(
    "--value",
    type=MIB,
    default=None,
    help="The policy value in force under the waiver (vram-reserve: MiB; gate: 0, the default).",
)
@click.option(
    "--gates",
    type=text(1024),
    metavar="A,B",
    help="With --policy gate: the gates whose failure is waived (scope: the recipe digest).",
)
@click.option("--approved-by", type=PERSON, required=True, help="Who approves the exception.")
@click.option("--reason", type=REASON, required=True, help="Why the exception is safe.")
@click.option(
    "--expires",
    type=text(64),
    metavar="WHEN",
    help="When it ends: RFC 3339 date (00:00 UTC that day) or date-time. This or --no-expiry.",
)
@click.option(
    "--no-expiry",
    is_flag=True,
    help="It never expires (until revoked): a choice the record names. This or --expires.",
)
def waive(
    session: Session,
    *,
    policy: str,
    scope: str,
    value: int | None,
    gates: str | None,
    approved_by: str,
    reason: str,
    expires: str | None,
    no_expiry: bool,
) -> Reply:
    """Record an attributed, scoped policy waiver that expires (or, said so, never does).

    vram-reserve sets the reserve (MiB) for GPU roles or a recipe digest; gate waives named
    functional gates (--gates) for one recipe digest. One of --expires and --no-expiry is
    required. Stored decisions are re-judged as new decisions; evidence is never rewritten."""
    if (expires is None) == (not no_expiry):
        raise click.UsageError("give --expires WHEN or --no-expiry (exactly one)")

    result = gpus_and_waivers.waive(
        session.app(),
        policy=policy,
        scope=scope,
        value=value,
        approved_by=approved_by,
        reason=reason,
        expires=expires,
        no_expiry=no_expiry,
        gates=tuple(g.strip() for g in (gates or "").split(",") if g.strip()),
    )
    return Reply(result)


@command("list", "anvilctl waivers list")
def waivers_list(session: Session) -> Reply:
    """Every waiver with its state now: active, expired, revoked or pending."""
    return Reply(views.waiver_table(gpus_and_waivers.list_waivers(session.app())))


@command("revoke", 'anvilctl waivers revoke wvr-0123456789ab --by alice --reason "pair re-cabled"')
@click.argument("waiver_id", type=REF)
@click.option("--by", type=PERSON, required=True, help="Who revokes the waiver.")
@click.option("--reason", type=REASON, required=True, help="Why the waiver is revoked.")
def waivers_revoke(session: Session, waiver_id: str, by: str, reason: str) -> Reply:
    """Revoke a waiver (a new record; the waiver stays); stored decisions are re-judged without it."""
    return Reply(gpus_and_waivers.revoke(session.app(), waiver_id, by=by, reason=reason))


waivers = group(
    "waivers", "List or revoke policy waivers.", "anvilctl waivers list", waivers_list, waivers_revoke
)
