"""The qualify command, waiver reclassification, evidence export/verify and audit reads.

`qualify_slot` runs the `qualify` plan (`anvil_ctl.engine.plans.qualify`)
against a slot's current candidate (the latest `candidate` identity, which must
be what the slot serves right now) and returns the decisions it recorded.
`reclassify_decisions` re-judges stored raw decisions under the waivers in force
(`anvil_ctl.engine.reclassify`); the `waive` command calls it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from anvil_ctl.adapters.credentials import TokenKind, resolve_token
from anvil_ctl.bootstrap import Context
from anvil_ctl.commands.recipes import resolve_recipe_path
from anvil_ctl.core.errors import AnvilError, BadInput, CredentialError
from anvil_ctl.core.model import LABEL_RECIPE, Identity
from anvil_ctl.engine import reclassify
from anvil_ctl.engine.plans import ab as ab_plan
from anvil_ctl.engine.plans import qualify as qualify_plan
from anvil_ctl.engine.plans.args import AbArgs, AbArm, QualifyArgs
from anvil_ctl.engine.reclassify import ReclassifyReport
from anvil_ctl.engine.runner import Outcome, TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.head import database_file
from anvil_ctl.qualify import (
    QualificationResult,
    Redaction,
    export_bundle,
    resolve_profile,
    verify_bundle,
)
from anvil_ctl.qualify.evidence import ExportResult, ManifestReference, VerifyResult, read_manifest
from anvil_ctl.qualify.profiles import PROFILES_DIR
from anvil_ctl.qualify.report import Progress
from anvil_ctl.recipes import Recipe, load_recipe, recipe_digest

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


def candidate_recipe(ctx: Context, world: World, ident: Identity) -> Recipe | None:
    """The candidate's recipe, if the recipe file still is the one that was loaded."""
    try:
        name = world.runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE)
        if not name:
            return None
        recipe = load_recipe(resolve_recipe_path(name, ctx.settings.recipes_dir))
    except AnvilError:
        return None
    return recipe if recipe_digest(recipe) == ident.recipe_digest else None


def router_secrets(ctx: Context) -> tuple[str, ...]:
    """The router tokens resolvable here: what evidence must never contain."""
    return _redaction(ctx).secrets


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
    recipe = candidate_recipe(ctx, world, ident) if ident else None
    chosen = profile or (recipe.profile if recipe else None)
    if ident is not None and chosen is None:
        raise BadInput(
            "the candidate's recipe (or its profile) cannot be read; pass --profile",
            field="profile",
        )
    resolved = resolve_profile(None, profile=chosen or "smoke", gates=list(gates) or None)
    args = QualifyArgs(
        slot=slot,
        candidate=ident,
        profile=resolved.source or resolved.name,
        gates=tuple(gates),
        recipe=recipe.name if recipe else "",
        engine=recipe.engine if recipe else "",
        source=recipe.source.model_dump(mode="json") if recipe and recipe.source else None,
    )
    plan = qualify_plan.build(args, world)
    plan.memo.progress, plan.memo.now = progress, now
    plan.memo.secrets = router_secrets(ctx)
    # Non-mutating: no host lock, but journaled like every transaction.
    engine = TransactionEngine(ctx.store, ctx.owner, faults=ctx.faults)
    outcome = engine.run(plan, world, tx_id=str(uuid.uuid4()))
    found = {d["id"]: d for d in qualification.decisions(ctx.store, slot=slot)}
    step = outcome.results.get("record-decision") or {}
    return QualifyOutcome(
        outcome=outcome,
        result=plan.memo.result,
        decision=found.get(step.get("decision_id", "")),
        reclassified=found.get(step.get("reclassified_id") or ""),
    )


# -- the matched A/B control --------------------------------------------------------------------


@dataclass
class AbOutcome:
    """An A/B transaction's outcome and, when it ran, its comparison."""

    outcome: Outcome
    comparison: dict[str, Any] | None = None
    tx_dir: str | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    def as_dict(self) -> dict[str, Any]:
        return {
            "tx_id": self.outcome.tx_id,
            "state": self.outcome.state.value,
            "reason": self.outcome.reason,
            "refusal": self.outcome.refusal.as_dict() if self.outcome.refusal else None,
            "results": self.outcome.results,
            "comparison": self.comparison,
            "tx_dir": self.tx_dir,
        }


def resolve_arm(ctx: Context, world: World, ref: str) -> AbArm:
    """The loaded candidate (of any slot) that `ref` names: recipe name, served model or
    container ID prefix (12+ characters); BadInput naming the arm when none or several match."""
    found: list[Identity] = []
    for slot in sorted(ctx.config.slots):
        ident = ctx.store.current_identity(slot, "candidate")
        if ident is None:
            continue
        try:
            recipe = world.runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE, "")
        except AnvilError:
            recipe = ""
        by_id = len(ref) >= 12 and ident.container_id.startswith(ref)
        if ref in (recipe, ident.served_model) or by_id:
            found.append(ident)
    if len(found) != 1:
        problem = "no loaded candidate matches it" if not found else "several loaded candidates match it"
        raise BadInput(
            f"--ab {ref}: {problem}; expected a recipe name, served model or container ID of one "
            "slot's loaded candidate (`anvilctl load RECIPE --slot S` first)",
            field="ab",
        )
    return AbArm(name=ref, identity=found[0])


def qualify_ab(ctx: Context, *, slot: str, arms: Sequence[str], profile: str | None = None) -> AbOutcome:
    """Run the matched A/B control of two loaded candidates (see `anvil_ctl.engine.plans.ab`)."""
    if len(arms) != 2 or arms[0] == arms[1]:
        raise BadInput(f"--ab: expected two different arms, got {list(arms)}", field="ab")
    world = ctx.world()
    ctx.config.slot(slot)
    chosen = profile or "ab-control"
    loaded, _ = ab_plan.load_ab_profile(chosen)
    args = AbArgs(
        slot=slot,
        arms=(resolve_arm(ctx, world, arms[0]), resolve_arm(ctx, world, arms[1])),
        profile=loaded.source or loaded.name,
    )
    plan = ab_plan.build(args, world)
    engine = TransactionEngine(ctx.store, ctx.owner, faults=ctx.faults)
    outcome = engine.run(plan, world, tx_id=str(uuid.uuid4()))
    compared = outcome.results.get("compare")
    comparison = None
    if compared:
        comparison = json.loads((Path(compared["tx_dir"]) / compared["artifact"]).read_text())
    return AbOutcome(outcome, comparison, compared["tx_dir"] if compared else None)


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
    """A shareable bundle of `tx`'s evidence: GPU UUIDs, host paths and router tokens redacted.

    The source must be the evidence the database recorded for `tx`; the export's own
    manifest SHA-256 is recorded too, so that `evidence verify` can bind the bundle.
    """
    tx_dir = evidence_tx_dir(ctx, tx)
    references = (_database_reference(ctx, tx_dir.name),)
    result = export_bundle(tx_dir, out_dir, redact=_redaction(ctx), references=references)
    qualification.record_manifest(
        ctx.store,
        tx_dir.name,
        result.manifest.sha256,
        kind="export",
        source_sha256=result.source_manifest_sha256,
    )
    return replace(result, recorded=True)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _database_reference(ctx: Context, tx_id: str) -> ManifestReference:
    """What the state database recorded for `tx_id`'s manifests; a note if it cannot say.

    A missing SQLite file is not created: then there is no database to ask.
    """
    db_file = database_file(ctx.settings.db_url)
    if db_file is not None and not db_file.is_file():
        return ManifestReference("database", (), f"no state database at {db_file}")
    try:
        found = qualification.manifests(ctx.store, tx_id)
    except AnvilError as exc:  # not initialised, foreign, unreachable: no answer from it
        return ManifestReference("database", (), f"state database unusable: {exc}")
    if not found:
        return ManifestReference("database", (), f"no manifest recorded for transaction {tx_id}")
    return ManifestReference("database", tuple(m["sha256"] for m in found))


def verify_evidence(ctx: Context, directory: Path, *, expect_manifest: str | None = None) -> VerifyResult:
    """Check `directory` against its manifest, and the manifest against what was recorded:
    the state database (when there is one) and `expect_manifest` (a SHA-256 printed at export)."""
    references: list[ManifestReference] = []
    if expect_manifest is not None:
        if not _SHA256.match(expect_manifest):
            raise BadInput(
                f"--expect-manifest: expected 64 lowercase hex digits, got {expect_manifest!r}",
                field="expect_manifest",
            )
        references.append(ManifestReference("--expect-manifest", (expect_manifest,)))
    try:
        tx_id = str(read_manifest(directory).get("tx_id") or "")
    except BadInput:
        tx_id = ""  # verify_bundle names what is wrong with the manifest
    if tx_id:
        references.insert(0, _database_reference(ctx, tx_id))
    return verify_bundle(directory, references)


def audit_decisions(ctx: Context, *, slot: str | None = None) -> list[dict[str, Any]]:
    return qualification.decisions(ctx.store, slot=slot)


def audit_evidence(ctx: Context, tx: str) -> dict[str, Any]:
    """`tx`'s gate rows from the database and its directory checked against the manifest."""
    tx_dir = evidence_tx_dir(ctx, tx)
    return {
        "tx_id": tx_dir.name,
        "gates": qualification.evidence(ctx.store, tx_dir.name),
        "verify": verify_bundle(tx_dir, (_database_reference(ctx, tx_dir.name),)).as_dict(),
    }
