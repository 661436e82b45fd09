"""The qualify command, waiver reclassification, evidence export/verify and audit reads.

`qualify_slot` runs the `qualify` plan (`anvil_ctl.engine.plans.qualify`)
against a slot's current candidate (the latest `candidate` identity, which must
be what the slot serves right now) and returns the decisions it recorded.
`reclassify_decisions` re-judges stored raw decisions under the waivers in force
(`anvil_ctl.engine.reclassify`); the `waive` command calls it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from anvil_ctl.adapters.credentials import TokenKind, resolve_token
from anvil_ctl.bootstrap import Context
from anvil_ctl.commands.recipes import resolve_recipe_path
from anvil_ctl.core.errors import AnvilError, BadInput, CredentialError
from anvil_ctl.core.model import LABEL_RECIPE, Identity
from anvil_ctl.engine import reclassify
from anvil_ctl.engine.plans import qualify as qualify_plan
from anvil_ctl.engine.plans.args import QualifyArgs
from anvil_ctl.engine.reclassify import ReclassifyReport
from anvil_ctl.engine.runner import Outcome, TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification
from anvil_ctl.qualify import (
    QualificationResult,
    Redaction,
    export_bundle,
    resolve_profile,
    verify_bundle,
)
from anvil_ctl.qualify.evidence import ExportResult, VerifyResult
from anvil_ctl.qualify.profiles import PROFILES_DIR
from anvil_ctl.qualify.report import Progress
from anvil_ctl.recipes import load_recipe, recipe_digest

# -- the command ------------------------------------------------------------------------------


@dataclass
class QualifyOutcome:
    """A qualify transaction's outcome, its result and the decisions it recorded."""

    outcome: Outcome
    result: QualificationResult | None = None
    decision: dict[str, Any] | None = None
    reclassified: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @property
    def effective_outcome(self) -> str | None:
        chosen = self.reclassified or self.decision
        return str(chosen["outcome"]) if chosen else None

    def as_dict(self) -> dict[str, Any]:
        base = self.result.as_dict() if self.result else {}
        return {
            **base,
            "tx_id": self.outcome.tx_id,
            "state": self.outcome.state.value,
            "reason": self.outcome.reason,
            "refusal": self.outcome.refusal.as_dict() if self.outcome.refusal else None,
            "decision": self.decision,
            "reclassified": self.reclassified,
            "effective_outcome": self.effective_outcome,
        }


def _recipe_profile(ctx: Context, world: World, ident: Identity) -> str | None:
    """The profile the candidate's recipe names, if that recipe is still the loaded one."""
    try:
        name = world.runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE)
        if not name:
            return None
        recipe = load_recipe(resolve_recipe_path(name, ctx.settings.recipes_dir))
    except AnvilError:
        return None
    return recipe.profile if recipe_digest(recipe) == ident.recipe_digest else None


def qualify_slot(
    ctx: Context,
    *,
    slot: str,
    profile: str | None = None,
    gates: Sequence[str] = (),
    progress: Progress | None = None,
    now: datetime | None = None,
) -> QualifyOutcome:
    """Qualify `slot`'s current candidate; record evidence and a decision (see module doc)."""
    world = ctx.world()
    ctx.config.slot(slot)
    ident = ctx.store.current_identity(slot, "candidate")
    chosen = profile or (_recipe_profile(ctx, world, ident) if ident else None)
    if ident is not None and chosen is None:
        raise BadInput(
            "the candidate's recipe (or its profile) cannot be read; pass --profile",
            field="profile",
        )
    resolved = resolve_profile(None, profile=chosen or "smoke", gates=list(gates) or None)
    args = QualifyArgs(
        slot=slot, candidate=ident, profile=resolved.source or resolved.name, gates=tuple(gates)
    )
    plan = qualify_plan.build(args, world)
    plan.memo.progress, plan.memo.now = progress, now
    # Non-mutating: no host lock, but journaled like every transaction.
    engine = TransactionEngine(ctx.store, ctx.owner, crash_at=ctx.settings.crash_at)
    outcome = engine.run(plan, world, tx_id=str(uuid.uuid4()))
    found = {d["id"]: d for d in qualification.decisions(ctx.store, slot=slot)}
    step = outcome.results.get("record-decision") or {}
    return QualifyOutcome(
        outcome=outcome,
        result=plan.memo.result,
        decision=found.get(step.get("decision_id", "")),
        reclassified=found.get(step.get("reclassified_id") or ""),
    )


# -- reclassification under waivers -----------------------------------------------------------


def reclassify_decisions(
    ctx: Context, *, slot: str | None = None, now: datetime | None = None
) -> ReclassifyReport:
    """Re-judge every stored raw decision (of `slot`) under the waivers active `now`."""
    return reclassify.reclassify_decisions(ctx.world(), slot=slot, now=now)


# -- evidence and audit -----------------------------------------------------------------------


def evidence_tx_dir(ctx: Context, tx: str) -> Path:
    """The evidence directory of transaction `tx` (an ID or a unique prefix)."""
    root = ctx.settings.evidence_dir
    found = sorted(p for p in root.glob(f"{tx}*") if p.is_dir()) if tx and root.is_dir() else []
    if len(found) != 1:
        raise BadInput(
            f"evidence of transaction {tx!r}: {'no match' if not found else 'ambiguous prefix'} in {root}",
            field="transaction",
        )
    return found[0]


def _redaction(ctx: Context) -> Redaction:
    secrets: list[str] = []
    rc = ctx.config.router
    if rc.kind != "none":
        tokens: tuple[tuple[TokenKind, str], ...] = (
            ("client", rc.client_token_env),
            ("admin", rc.admin_token_env),
        )
        for kind, env_name in tokens:
            try:
                token = resolve_token(kind, env_name, ctx.env, rc.credential_file)
            except (CredentialError, BadInput):
                continue  # not resolvable here: then nothing of it can be redacted either
            secrets.append(token.reveal())
    paths = [
        str(p.resolve())
        for p in (ctx.settings.state_dir, ctx.settings.evidence_dir, ctx.settings.recipes_dir)
    ]
    # Where the package's profiles live (a decision names its profile's file) is a host path too.
    paths.append(str(PROFILES_DIR.parent.parent))
    home = ctx.env.get("HOME", "")
    if home.strip("/"):
        paths.append(home)
    return Redaction(secrets=tuple(secrets), paths=tuple(paths))


def export_evidence(ctx: Context, tx: str, out_dir: Path) -> ExportResult:
    """A shareable bundle of `tx`'s evidence: GPU UUIDs, host paths and router tokens redacted."""
    return export_bundle(evidence_tx_dir(ctx, tx), out_dir, redact=_redaction(ctx))


def verify_evidence(directory: Path) -> VerifyResult:
    return verify_bundle(directory)


def audit_decisions(ctx: Context, *, slot: str | None = None) -> list[dict[str, Any]]:
    return qualification.decisions(ctx.store, slot=slot)


def audit_evidence(ctx: Context, tx: str) -> dict[str, Any]:
    """`tx`'s gate rows from the database and its directory checked against the manifest."""
    tx_dir = evidence_tx_dir(ctx, tx)
    return {
        "tx_id": tx_dir.name,
        "gates": qualification.evidence(ctx.store, tx_dir.name),
        "verify": verify_bundle(tx_dir).as_dict(),
    }
