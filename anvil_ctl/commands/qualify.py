"""The qualify command, the matched A/B control and waiver reclassification.

`qualify_slot` runs the `qualify` plan (`anvil_ctl.engine.plans.qualify`)
against a slot's current candidate (the latest `candidate` identity, which must
be what the slot serves right now) and returns the decisions it recorded.
`reclassify_decisions` re-judges stored raw decisions under the waivers in force
(`anvil_ctl.engine.reclassify`); the `waive` command calls it. Evidence export,
verify and the audit reads live in `commands.evidence` (re-exported here).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NotRequired, TypedDict

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.evidence import (  # re-exported: the CLI and tests find them here
    EvidenceAudit,
    audit_decisions,
    audit_evidence,
    evidence_tx_dir,
    export_evidence,
    router_secrets,
    verify_evidence,
)
from anvil_ctl.commands.recipes import recipe_search, resolve_recipe_path
from anvil_ctl.core.errors import AnvilError, BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_RECIPE
from anvil_ctl.core.validate import check_duration, require
from anvil_ctl.engine import reclassify
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans import ab as ab_plan
from anvil_ctl.engine.plans import qualify as qualify_plan
from anvil_ctl.engine.plans.args import AbArgs, AbArm, QualifyArgs
from anvil_ctl.engine.reclassify import ReclassifyReport
from anvil_ctl.engine.runner import TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.qualify.profiles import resolve_profile
from anvil_ctl.qualify.runner import Progress, QualificationResult
from anvil_ctl.recipes.model import Recipe, load_recipe, recipe_digest

# -- the command ------------------------------------------------------------------------------


@dataclass
class QualifyOutcome:
    """A qualify transaction's outcome, its result and the decisions it recorded."""

    outcome: Outcome
    result: QualificationResult | None = None
    decision: DecisionRecord | None = None
    reclassified: DecisionRecord | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @property
    def effective_outcome(self) -> str | None:
        chosen = self.reclassified or self.decision
        return str(chosen["outcome"]) if chosen else None

    def as_dict(self) -> dict[str, object]:
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


def candidate_recipe(app: App, world: World, ident: Identity) -> Recipe | None:
    """The candidate's recipe, if the recipe file still is the one that was loaded."""
    try:
        name = world.runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE)
        if not name:
            return None
        recipe = load_recipe(resolve_recipe_path(name, recipe_search(app)))
    except AnvilError:
        return None
    return recipe if recipe_digest(recipe) == ident.recipe_digest else None


def qualify_slot(
    app: App,
    *,
    slot: str,
    profile: str | None = None,
    gates: Sequence[str] = (),
    progress: Progress | None = None,
    now: datetime | None = None,
    timeout_s: float | None = None,
) -> QualifyOutcome:
    """Qualify `slot`'s current candidate; record evidence and a decision (see module doc).

    `timeout_s` bounds the run: gates not started by then are recorded as failed (timeout).
    """
    if timeout_s is not None:
        timeout_s = require("--timeout", check_duration, timeout_s)
    world = app.world()
    app.config.slot(slot)
    ident = app.store.current_identity(slot, "candidate")
    recipe = candidate_recipe(app, world, ident) if ident else None
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
        timeout_s=timeout_s,
    )
    plan = qualify_plan.build(args, world)
    plan.memo.progress, plan.memo.now = progress, now
    plan.memo.secrets = router_secrets(app)
    # Non-mutating: no host lock, but journaled like every transaction.
    engine = TransactionEngine(app.store, app.owner, faults=app.faults)
    outcome = engine.run(plan, world, tx_id=str(uuid.uuid4()))
    step = outcome.results.get("record-decision") or {}
    decision_id, reclassified_id = step.get("decision_id"), step.get("reclassified_id")
    return QualifyOutcome(
        outcome=outcome,
        result=plan.memo.result,
        decision=_decision_of(app, decision_id, slot),
        reclassified=_decision_of(app, reclassified_id, slot),
    )


def _decision_of(app: App, decision_id: object, slot: str) -> DecisionRecord | None:
    """The decision `decision_id` names when it is one of `slot`'s, else None."""
    found = qualification.decision(app.store, decision_id) if isinstance(decision_id, str) else None
    return found if found is not None and found["slot"] == slot else None


# -- the matched A/B control --------------------------------------------------------------------


class ArmFigures(TypedDict):
    """One arm's p50s in one cell (`qualify.ab.METRICS`), and how many requests completed."""

    decode_p50: float | None
    prefill_p50: float | None
    ttft_p50: float | None
    prompt_tokens_p50: float | None
    completed: int | None
    requests: int | None


class ComparedCell(TypedDict):
    """One (context, concurrency) cell of the comparison; a skipped cell has no figures."""

    nominal_tokens: int
    concurrency: int
    label: str
    skipped: NotRequired[str]
    A: NotRequired[ArmFigures]
    B: NotRequired[ArmFigures]
    delta_pct: NotRequired[dict[str, float | None]]  # metric -> B vs A, in %


class Verdict(TypedDict):
    outcome: str  # selected | boundary-violated | no-difference | incomplete
    selected: str | None
    faster: NotRequired[str]
    boundaries: list[JSONObject]
    summary: str


class Comparison(TypedDict):
    """The comparison artifact an A/B transaction wrote (`qualify.ab.compare`), as read back."""

    arms: dict[str, str]  # A | B -> the arm's name
    select: str
    cells: list[ComparedCell]
    verdict: Verdict
    declaration_digest: NotRequired[str | None]


@dataclass
class AbOutcome:
    """An A/B transaction's outcome and, when it ran, its comparison."""

    outcome: Outcome
    comparison: Comparison | None = None
    tx_dir: str | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    def as_dict(self) -> dict[str, object]:
        return {
            "tx_id": self.outcome.tx_id,
            "state": self.outcome.state.value,
            "reason": self.outcome.reason,
            "refusal": self.outcome.refusal.as_dict() if self.outcome.refusal else None,
            "results": self.outcome.results,
            "comparison": self.comparison,
            "tx_dir": self.tx_dir,
        }


def resolve_arm(app: App, world: World, ref: str) -> AbArm:
    """The loaded candidate (of any slot) that `ref` names: recipe name, served model or
    container ID prefix (12+ characters); BadInput naming the arm when none or several match."""
    found: list[Identity] = []
    for slot in sorted(app.config.slots):
        ident = app.store.current_identity(slot, "candidate")
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


def qualify_ab(app: App, *, slot: str, arms: Sequence[str], profile: str | None = None) -> AbOutcome:
    """Run the matched A/B control of two loaded candidates (see `anvil_ctl.engine.plans.ab`)."""
    if len(arms) != 2 or arms[0] == arms[1]:
        raise BadInput(f"--ab: expected two different arms, got {list(arms)}", field="ab")
    world = app.world()
    app.config.slot(slot)
    chosen = profile or "ab-control"
    loaded, _ = ab_plan.load_ab_profile(chosen)
    args = AbArgs(
        slot=slot,
        arms=(resolve_arm(app, world, arms[0]), resolve_arm(app, world, arms[1])),
        profile=loaded.source or loaded.name,
    )
    plan = ab_plan.build(args, world)
    engine = TransactionEngine(app.store, app.owner, faults=app.faults)
    outcome = engine.run(plan, world, tx_id=str(uuid.uuid4()))
    compared = outcome.results.get("compare")
    comparison = None
    if compared:
        comparison = json.loads((Path(str(compared["tx_dir"])) / str(compared["artifact"])).read_text())
    return AbOutcome(outcome, comparison, str(compared["tx_dir"]) if compared else None)


# -- reclassification under waivers -----------------------------------------------------------


def reclassify_decisions(
    app: App, *, slot: str | None = None, now: datetime | None = None
) -> ReclassifyReport:
    """Re-judge every stored raw decision (of `slot`) under the waivers active `now`."""
    return reclassify.reclassify_decisions(app.world(), slot=slot, now=now)


__all__ = [
    "AbOutcome",
    "Comparison",
    "EvidenceAudit",
    "QualifyOutcome",
    "audit_decisions",
    "audit_evidence",
    "candidate_recipe",
    "evidence_tx_dir",
    "export_evidence",
    "qualify_ab",
    "qualify_slot",
    "reclassify_decisions",
    "resolve_arm",
    "router_secrets",
    "verify_evidence",
]
