"""The claim ledger commands: recount published claims from an evidence bundle, render the ledger."""

from __future__ import annotations

from pathlib import Path

from anvil_ctl.evidence.claims import ClaimsCheck, check_ledger, load_ledger, render_ledger


def check_claims(ledger: Path, evidence: Path) -> ClaimsCheck:
    """Recount every claim of `ledger` from the verified bundle `evidence` (see evidence.claims)."""
    return check_ledger(load_ledger(ledger), evidence)


def render_claims(ledger: Path) -> str:
    return render_ledger(load_ledger(ledger))
