"""Qualification: qualify, evidence export|verify.

`qualify` exits 0 whenever it ran and recorded a decision, whatever the decision
says (verified, policy-infeasible or failed are data, printed prominently and
stored); 3 when refused before running (no candidate, or the slot serves
something else); 4 when the candidate changed during the run (no decision).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from anvil_ctl.cli.complete import complete_slots
from anvil_ctl.cli.params import RECIPE, REF, Text
from anvil_ctl.cli.session import Reply, Session, example, pass_session
from anvil_ctl.core.states import ExitCode

QUALIFY_HELP = """\
Qualify the slot's candidate: record evidence and a decision.

Runs the qualification profile against the slot's current candidate (the latest loaded
one, which must be what the slot serves), writes the evidence under
<state>/evidence/<transaction>/ and records a decision bound to the candidate's identity.

The decision is computed under the standing policy; if an active waiver changes it, a
second decision that reclassifies the first is recorded too (the first is never changed).

\b
Exit status:
  0  the qualification ran and a decision was recorded, whatever the decision
     (verified, policy-infeasible or failed: read it in the output or with --json)
  3  refused before running (no candidate, or the slot serves something else)
  4  the candidate changed during the run (evidence kept, no decision recorded)
"""


@click.command(
    "qualify",
    help=QUALIFY_HELP,
    short_help="Qualify the candidate; record evidence and a decision.",
    epilog=example("anvilctl qualify --slot primary --profile demo --gates vram_reserve"),
)
@click.option(
    "--slot",
    type=REF,
    required=True,
    shell_complete=complete_slots,
    metavar="SLOT",
    help="The slot whose candidate to qualify.",
)
@click.option("--profile", type=RECIPE, help="Profile name or TOML path (default: the recipe's profile).")
@click.option(
    "--gates", type=Text(1024), metavar="A,B", help="Run only these gates of the profile, comma-separated."
)
@pass_session
def qualify(session: Session, slot: str, profile: str | None, gates: str | None) -> Reply:
    from anvil_ctl.commands import qualify as qualify_cmd
    from anvil_ctl.qualify import make_progress

    chosen = [g.strip() for g in (gates or "").split(",") if g.strip()]
    out = qualify_cmd.qualify_slot(
        session.context(), slot=slot, profile=profile, gates=chosen, progress=make_progress(sys.stderr)
    )
    return Reply(out, ExitCode(out.exit_code))


@click.command("export", epilog=example("anvilctl evidence export 8259c0de ./bundle-8259"))
@click.argument("tx", type=REF)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@pass_session
def evidence_export(session: Session, tx: str, directory: Path) -> Reply:
    """Write a redacted, shareable copy of a transaction's evidence.

    TX is a transaction ID or a unique prefix, DIR a new or empty directory. GPU UUIDs, host paths and router
    tokens are redacted; the copy gets its own manifest.
    """
    from anvil_ctl.commands import qualify as qualify_cmd

    return Reply(qualify_cmd.export_evidence(session.context(), tx, directory))


@click.command(
    "verify", epilog=example("anvilctl evidence verify ./bundle-8259 --expect-manifest 3f1c...9a0e")
)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--expect-manifest",
    metavar="SHA",
    help="The manifest's SHA-256 as printed at export, for a host without the state database.",
)
@pass_session
def evidence_verify(session: Session, directory: Path, expect_manifest: str | None) -> Reply:
    """Check an evidence bundle against its manifest, and the manifest against the record (exit 6).

    DIR is a bundle written by `evidence export` or a transaction's evidence directory.
    Every artifact must match the manifest, and the manifest's own SHA-256 must be one
    recorded for its transaction in the state database (when there is one) and equal
    --expect-manifest (when given); the output says which it used. A manifest neither
    knows is reported unbound (exit 6): a consistently edited bundle looks intact.
    """
    from anvil_ctl.commands import qualify as qualify_cmd

    if not directory.is_dir():
        raise click.BadParameter(f"{directory} is not a directory", param_hint="'DIR'")
    result = qualify_cmd.verify_evidence(session.context(), directory, expect_manifest=expect_manifest)
    return Reply(result, ExitCode.OK if result.ok else ExitCode.DRIFT)


evidence = click.Group(
    "evidence",
    commands=[evidence_export, evidence_verify],
    help="Evidence bundles: export a redacted copy, verify one.",
    epilog=example("anvilctl evidence verify ./bundle-8259"),
)
