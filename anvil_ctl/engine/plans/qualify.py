"""`qualify`: run a profile's gates against the slot's candidate and record a decision bound to
its `qualification_digest`. A non-mutating transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.engine_profile import engine_profile
from anvil_ctl.core.errors import AdapterError, AnvilError, BadInput, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import LABEL_RECIPE
from anvil_ctl.core.steps import Guard, Plan, Step, StepContext, StepResult
from anvil_ctl.engine.assertions import observed_context
from anvil_ctl.engine.guards import CandidateIsServing
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import QualifyArgs, QualifyRequest
from anvil_ctl.engine.serving import identity_drift, inspect_or_none, serving_problems
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification, waiver_rows
from anvil_ctl.persistence.qualification import GateEvidence
from anvil_ctl.recipes.model import Recipe, load_recipe, recipe_digest

if TYPE_CHECKING:
    from anvil_ctl.qualify.gates.base import ReserveReading
    from anvil_ctl.qualify.runner import Progress, QualificationResult


@dataclass
class QualifyMemo:
    result: QualificationResult | None = None
    """What `run-gates` measured; only this process has it (a crash loses it: no decision)."""
    progress: Progress | None = None
    now: datetime | None = None
    """When waivers are judged (tests pin it); None: the time `record-decision` runs."""
    secrets: tuple[str, ...] = ()
    """Router tokens the log audit redacts (never journaled: the memo is not)."""


Ctx = StepContext[QualifyArgs, World, QualifyMemo]


def died_problems(world: World, ident: Identity) -> list[str]:
    """Why a candidate that stopped during the run is not `ident` stopped (empty: it is):
    a removed container, or one with another image or config, is not the identity decided on."""
    return [
        f"candidate container {ident.container_id[:12]}: {d.field} drifted"
        for d in identity_drift(world, ident)
        if d.field != "status"
    ]


GUARDS: list[Guard[Ctx]] = [CandidateIsServing()]


def _candidate(ctx: Ctx) -> Identity:
    cand = ctx.args.candidate
    if cand is None:  # CandidateIsServing refuses this before any step
        raise StepFailed("qualify without a candidate reached a step")
    return cand


def roles_of(world: World, ident: Identity) -> tuple[str, ...]:
    return tuple(ident.gpu_roles or world.config.slot(ident.slot).gpu_roles)


def _reserve_probe(world: World, roles: Sequence[str]) -> Callable[[], list[ReserveReading]] | None:
    """(uuid, free MiB, standing reserve MiB) per role of the candidate, read now."""
    gpus, config = world.gpus, world.config
    if gpus is None or not roles:
        return None

    def probe() -> list[ReserveReading]:
        by_uuid = {r.uuid.lower(): r for r in gpus.gpus()}
        out = []
        for role in roles:
            uuid_ = config.gpu_roles[role].uuid
            reading = by_uuid.get(uuid_.lower())
            if reading is None:
                raise AdapterError(f"GPU role {role} ({uuid_}) was not reported by the probe")
            out.append((uuid_, reading.free_mib, config.reserve_for(role)))
        return out

    return probe


def died(world: World, ident: Identity) -> JSONObject | None:
    """None while the candidate's container runs; else what the runtime says of it."""
    info = inspect_or_none(world, ident.container_id)
    if info is None:
        return {"container_id": ident.container_id, "status": "absent", "exit_code": None}
    if info.running:
        return None
    return {"container_id": info.id, "status": info.status, "exit_code": info.exit_code}


def run_gates(ctx: Ctx) -> StepResult:
    from anvil_ctl.qualify.profiles import resolve_profile
    from anvil_ctl.qualify.runner import run_qualification

    world, ident = ctx.world, _candidate(ctx)
    profile = resolve_profile(None, profile=ctx.args.profile, gates=list(ctx.args.gates) or None)
    engine = engine_profile(ident.engine_profile)
    # Where /v1/models reports no context length, observe it the profile's way (llama.cpp's
    # refusal of an over-long prompt) so long-context gates are bounded by what is served.
    context = None if engine.context_source == "models" else observed_context(world, ident).as_dict()
    result = run_qualification(
        world.config.slot(ident.slot).base_url,
        ident.served_model,
        profile,
        evidence_dir=world.settings.evidence_dir,
        tx_id=ctx.tx_id,
        identity_digest=ident.qualification_digest,
        reserve_probe=_reserve_probe(world, roles_of(world, ident)),
        progress=ctx.memo.progress,
        # The candidate's bounded log, read when the log audit runs (after the workload).
        container_log=lambda lines, size: world.runtime.logs(
            ident.container_id, max_lines=lines, max_bytes=size
        ),
        engine=engine,
        secrets=ctx.memo.secrets,
        provenance={"recipe": ctx.args.recipe, "engine": ctx.args.engine, "source": ctx.args.source},
        timeout_s=ctx.args.timeout_s,
        recorded_identity=ident.as_dict()
        | {
            "qualification_digest": ident.qualification_digest,
            "gpu_role_uuids": {r: world.config.gpu_roles[r].uuid for r in roles_of(world, ident)},
        },
        context=context,
        liveness=partial(died, world, ident),
    )
    ctx.memo.result = result
    # The manifest's own hash binds the directory to this record (`evidence verify`).
    qualification.record_manifest(world.store, ctx.tx_id, result.manifest.sha256, kind="qualify")
    return {
        "tx_dir": result.tx_dir,
        "outcome": result.outcome,
        "manifest_sha256": result.manifest.sha256,
        "gates": len(result.gates),
    }


def record_decision(ctx: Ctx) -> StepResult:
    from anvil_ctl.engine.reclassify import raw_decision_body, reclassify_one
    from anvil_ctl.qualify.runner import ENGINE_GATE

    world, ident, result = ctx.world, _candidate(ctx), ctx.memo.result
    if result is None:
        raise StepFailed("no qualification result in this process; rerun qualify")
    # The decision binds to the identity: it must still be what ran the whole workload. An
    # engine that died during the run is that identity, stopped: its failure is the decision.
    died = any(g.name == ENGINE_GATE and not g.passed for g in result.gates)
    problems = died_problems(world, ident) if died else serving_problems(world, ident)
    if problems:
        raise StepFailed("candidate changed during qualification: " + "; ".join(problems))
    tx_dir = Path(result.tx_dir)
    rows: list[GateEvidence] = [
        {
            "name": gate.name,
            "kind": gate.kind,
            "passed": gate.passed,
            "classification": gate.classification,
            "artifact": str(tx_dir / art.path) if art else "",
            "sha256": art.sha256 if art else "",
            "size": art.size if art else 0,
        }
        for gate in result.gates
        for art in [result.artifact_for(gate.name)]
    ]
    qualification.record_evidence(world.store, ctx.tx_id, rows)
    now = ctx.memo.now or datetime.now(UTC)
    active = waiver_rows.waivers(world.store)
    decision = result.decision
    bound = {
        "tx_id": ctx.tx_id,
        "identity_digest": ident.qualification_digest,
        "evidence_sha256": decision.evidence_sha256,
        "outcome": decision.outcome,
    }
    raw_id = "dec-" + sha256_hex(bound)[:16]
    qualification.record_decision(
        world.store,
        decision_id=raw_id,
        tx_id=ctx.tx_id,
        slot=ident.slot,
        identity_digest=ident.qualification_digest,
        container_id=ident.container_id,
        outcome=decision.outcome,
        profile=decision.profile,
        manifest_sha256=result.manifest.sha256,
        reasons=decision.reasons,
        body=raw_decision_body(
            world, ident, result=result, active=active, now=now, roles=roles_of(world, ident)
        ),
    )
    raw = qualification.decision(world.store, raw_id)
    assert raw is not None  # recorded above (or before, with the same content)
    newer = reclassify_one(world, raw, active, now, tx_id=ctx.tx_id)
    return {
        "decision_id": raw_id,
        "outcome": decision.outcome,
        "identity_digest": ident.qualification_digest,
        "reclassified_id": newer["id"] if newer else None,
        "effective_outcome": newer["outcome"] if newer else decision.outcome,
    }


def _loaded_recipe(world: World, ident: Identity, dirs: Sequence[Path]) -> Recipe | None:
    """The candidate's recipe, if the file its label names is still the one that was loaded."""
    try:
        name = world.runtime.inspect(ident.container_id).labels.get(LABEL_RECIPE)
        path = next((d / f"{name}.toml" for d in dirs if (d / f"{name}.toml").exists()), None)
        recipe = load_recipe(path) if name and path else None
    except AnvilError:
        return None
    return recipe if recipe is not None and recipe_digest(recipe) == ident.recipe_digest else None


def prepare(world: World, req: QualifyRequest) -> QualifyArgs:
    """The slot's loaded candidate, its recipe (when still the loaded one) and the profile."""
    from anvil_ctl.qualify.profiles import resolve_profile

    world.config.slot(req.slot)
    ident = world.store.current_identity(req.slot, "candidate")
    recipe = _loaded_recipe(world, ident, req.recipe_dirs) if ident else None
    chosen = req.profile or (recipe.profile if recipe else None)
    if ident is not None and chosen is None:
        raise BadInput(
            "the candidate's recipe (or its profile) cannot be read; pass --profile", field="profile"
        )
    resolved = resolve_profile(None, profile=chosen or "smoke", gates=list(req.gates) or None)
    return QualifyArgs(
        slot=req.slot,
        candidate=ident,
        profile=resolved.source or resolved.name,
        gates=req.gates,
        recipe=recipe.name if recipe else "",
        engine=recipe.engine if recipe else "",
        source=recipe.source.model_dump(mode="json") if recipe and recipe.source else None,
        timeout_s=req.timeout_s,
    )


def build(args: QualifyArgs, world: World, req: object = None) -> Plan[QualifyArgs, World, QualifyMemo]:
    memo = QualifyMemo()
    if isinstance(req, QualifyRequest):  # what the live run shows and redacts; never journaled
        memo.progress, memo.now, memo.secrets = req.progress, req.now, req.secrets
    return Plan(
        kind="qualify",
        args=args,
        steps=[
            Step("run-gates", run_gates, None, "run the profile's gates; write the evidence"),
            Step(
                "record-decision",
                record_decision,
                None,
                "re-check the candidate; record gate rows and the decision",
            ),
        ],
        memo=memo,
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, [args.slot]),
        keeps_serving=False,  # nothing on the host changes
    )
