"""`anvilctl claims check|render`: the claim ledger of published numbers."""

from __future__ import annotations

from pathlib import Path

import click

from anvil_ctl.cli.session import Reply, Session, example, group, pass_session
from anvil_ctl.core.states import ExitCode

ledger_argument = click.argument("ledger", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))


@click.command("check", epilog=example("anvilctl claims check claims.toml --evidence ./bundle-8259"))
@ledger_argument
@click.option(
    "--evidence",
    "evidence",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="The evidence bundle the claims cite (an export or a transaction's evidence directory).",
)
@pass_session
def check(session: Session, ledger: Path, evidence: Path) -> Reply:
    """Recount every published claim from the verified evidence bundle (exit 6 on any difference).

    Each local claim's numbers are read from its artifact's JSON path, rounded as declared and
    compared; external-prior claims are listed, never recounted."""
    with session.working(f"claims check: recounting {ledger.name} from the verified bundle"):
        from anvil_ctl.evidence.claims import check_ledger, load_ledger

        result = check_ledger(load_ledger(ledger), evidence)
    return Reply(result, ExitCode.OK if result.ok else ExitCode.DRIFT)


@click.command("render", epilog=example("anvilctl claims render claims.toml"))
@ledger_argument
@pass_session
def render(session: Session, ledger: Path) -> Reply:
    """Print the claim ledger as the seeds' table: public claim, conditions, evidence."""
    from anvil_ctl.cli.views import Text
    from anvil_ctl.evidence.claims import load_ledger, render_ledger

    session.app()
    return Reply(Text(render_ledger(load_ledger(ledger))))


claims = group(
    "claims",
    "The claim ledger: every published number bound to its conditions and its evidence.",
    "anvilctl claims check claims.toml --evidence ./bundle-8259",
    check,
    render,
)
