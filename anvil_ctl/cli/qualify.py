"""Qualification: qualify, evidence export|verify|report (exit codes: QUALIFY_HELP), and
claims check|render (the claim ledger of published numbers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.complete import complete_transactions
from anvil_ctl.cli.options import slot_option, timeout_option
from anvil_ctl.cli.params import RECIPE, REF, text
from anvil_ctl.cli.session import Lazy, Reply, Session, command, group
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.cli import views
    from anvil_ctl.commands import evidence as evidence_cmd
    from anvil_ctl.commands import qualify as qualify_cmd
else:
    views = Lazy("anvil_ctl.cli.views")
    evidence_cmd = Lazy("anvil_ctl.commands.evidence")
    qualify_cmd = Lazy("anvil_ctl.commands.qualify")


QUALIFY_HELP = """\
Qualify the slot's candidate: record evidence and a decision.

Runs the qualification profile against the slot's current candidate (the latest loaded
one, which must be what the slot serves), writes the evidence under
<state>/evidence/<transaction>/ and records a decision bound to the candidate's identity.

The decision is computed under the standing policy; if an active waiver changes it, a
second decision that reclassifies the first is recorded too (the first is never changed).

With --ab ARM_A ARM_B it runs the matched A/B control instead: the capacity cells of two
loaded candidates of the same model (each a recipe name, served model or container ID),
one after the other, alternating arms per repetition. The profile (default ab-control)
declares the protected boundaries, written with their digest before the first request;
the verdict names the selected arm or each violated boundary.

\b
Exit status:
  0  the qualification ran and a decision was recorded, whatever the decision
     (verified, policy-infeasible or failed: read it in the output or with --json);
     with --ab: the comparison ran, whatever its verdict
  3  refused before running (no candidate, or the slot serves something else)
  4  the candidate changed during the run (evidence kept, no decision recorded)
"""


@command(
    "qualify",
    "anvilctl qualify --slot primary --profile demo --gates vram_reserve",
    help=QUALIFY_HELP,
    short_help="Qualify the candidate; record evidence and a decision.",
)
@slot_option(
    "The slot whose candidate to qualify (with --ab: whose serving choice the A/B informs).", required=True
)
@click.option("--profile", type=RECIPE, help="Profile name or TOML path (default: the recipe's profile).")
@click.option(
    "--gates", type=text(1024), metavar="A,B", help="Run only these gates of the profile, comma-separated."
)
@click.option(
    "--ab",
    nargs=2,
    type=text(200),
    metavar="ARM_A ARM_B",
    default=None,
    help="Matched A/B of two loaded candidates of one model (profile default: ab-control).",
)
@timeout_option(
    "Longest the qualification may run, e.g. 30m: gates not started by then are recorded as "
    "failed (timeout), so the decision cannot pass. No request waits longer either."
)
def qualify(
    session: Session,
    *,
    slot: str,
    profile: str | None,
    gates: str | None,
    ab: tuple[str, str] | None,
    timeout_s: float | None,
) -> Reply:
    from anvil_ctl.cli.progress import GateProgress

    if ab:
        if gates:
            raise click.UsageError("--gates does not go with --ab (the profile's capacity cells run)")
        if timeout_s is not None:
            raise click.UsageError("--timeout does not go with --ab (the profile's cells all run)")
        compared = qualify_cmd.qualify_ab(session.app(), slot=slot, arms=ab, profile=profile)
        return Reply(compared, ExitCode(compared.exit_code))
    chosen = [g.strip() for g in (gates or "").split(",") if g.strip()]
    app = session.app()
    progress = None if session.options.as_json else GateProgress(app.progress)
    out = qualify_cmd.qualify_slot(
        app, slot=slot, profile=profile, gates=chosen, progress=progress, timeout_s=timeout_s
    )
    return Reply(out, ExitCode(out.exit_code))


@command("export", "anvilctl evidence export 8259c0de ./bundle-8259")
@click.argument("tx", type=REF, shell_complete=complete_transactions)
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
def evidence_export(session: Session, tx: str, directory: Path) -> Reply:
    """Write a redacted, shareable copy of a transaction's evidence.

    TX is an ID or unique prefix, DIR new or empty. GPU UUIDs, host paths and router tokens
    are redacted; the copy gets its own manifest."""
    with session.working(f"evidence export: copying and redacting the evidence of {tx}") as app:
        return Reply(evidence_cmd.export_evidence(app, tx, directory))


@command("verify", "anvilctl evidence verify ./bundle-8259 --expect-manifest 3f1c...9a0e")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--expect-manifest",
    metavar="SHA",
    help="The manifest's SHA-256 as printed at export, for a host without the state database.",
)
def evidence_verify(session: Session, directory: Path, expect_manifest: str | None) -> Reply:
    """Check an evidence bundle against its manifest, and the manifest against the record (exit 6).

    Every artifact must match the manifest, whose SHA-256 must be recorded for its transaction
    (when there is a database) and equal --expect-manifest (when given). A manifest neither
    knows is unbound (exit 6): a consistently edited bundle looks intact."""
    if not directory.is_dir():
        raise click.BadParameter(f"{directory} is not a directory", param_hint="'DIR'")
    with session.working(f"evidence verify: hashing every artifact of {directory}") as app:
        result = evidence_cmd.verify_evidence(app, directory, expect_manifest=expect_manifest)
    return Reply(result, ExitCode.OK if result.ok else ExitCode.DRIFT)


@command("report", "anvilctl evidence report 8259c0de -o report-8259.html")
@click.argument("tx", shell_complete=complete_transactions)
@click.option(
    "-o",
    "--output",
    metavar="FILE.html",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the page (default <state>/reports/<transaction>.html).",
)
def evidence_report(session: Session, tx: str, output: Path | None) -> Reply:
    """Write the one-page HTML report of a qualification (exit 6 if its evidence was altered).

    TX is an ID, a unique prefix or an evidence directory. One self-contained file, its figures
    only from verified evidence bundles. Needs the optional extra `report` (matplotlib)."""
    with session.working(f"evidence report: verifying the bundles of {tx} and drawing the page") as app:
        return Reply(evidence_cmd.evidence_report(app, tx, output))


evidence = group(
    "evidence",
    "Evidence bundles: export a redacted copy, verify one, report one on a page.",
    "anvilctl evidence verify ./bundle-8259",
    evidence_export,
    evidence_verify,
    evidence_report,
)


ledger_argument = click.argument("ledger", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))


@command("check", "anvilctl claims check claims.toml --evidence ./bundle-8259")
@ledger_argument
@click.option(
    "--evidence",
    "evidence",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="The evidence bundle the claims cite (an export or a transaction's evidence directory).",
)
def claims_check(session: Session, ledger: Path, evidence: Path) -> Reply:
    """Recount every published claim from the verified evidence bundle (exit 6 on any difference).

    Each local claim's numbers are read from its artifact's JSON path, rounded as declared and
    compared; external-prior claims are listed, never recounted."""
    with session.working(f"claims check: recounting {ledger.name} from the verified bundle"):
        from anvil_ctl.evidence.claims import check_ledger, load_ledger

        result = check_ledger(load_ledger(ledger), evidence)
    return Reply(result, ExitCode.OK if result.ok else ExitCode.DRIFT)


@command("render", "anvilctl claims render claims.toml")
@ledger_argument
def claims_render(session: Session, ledger: Path) -> Reply:
    """Print the claim ledger as the seeds' table: public claim, conditions, evidence."""
    from anvil_ctl.evidence.claims import load_ledger, render_ledger

    session.app()
    return Reply(views.Text(render_ledger(load_ledger(ledger))))


claims = group(
    "claims",
    "The claim ledger: every published number bound to its conditions and its evidence.",
    "anvilctl claims check claims.toml --evidence ./bundle-8259",
    claims_check,
    claims_render,
)
