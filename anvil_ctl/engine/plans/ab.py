"""`ab`: the matched A/B control of two loaded candidates of the same model, both serving at
once on their own bindings. A non-mutating transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from anvil_ctl.core.errors import AnvilError, BadInput, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, get_int, get_object, get_objects
from anvil_ctl.core.model import LABEL_RECIPE
from anvil_ctl.core.steps import Guard, Plan, Refusal, Step, StepContext, StepResult
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.plans.args import AbArgs, AbArm, AbRequest
from anvil_ctl.engine.serving import serving_problems
from anvil_ctl.engine.world import World
from anvil_ctl.persistence import qualification

if TYPE_CHECKING:
    from anvil_ctl.evidence.bundle import EvidenceWriter
    from anvil_ctl.qualify.ab import Arm
    from anvil_ctl.qualify.gates.capacity import Capacity
    from anvil_ctl.qualify.profiles import Profile

COMPARISON = "ab-comparison.json"
ARM_IDENTITY = ("slot", "container_id", "qualification_digest", "recipe_digest", "model_identity", "image_id")


@dataclass
class AbMemo:
    measured: JSONObject | None = None
    """Both arms' raw cells from `measure`; only this process has them."""


def _cells(measured: JSONObject) -> dict[str, list[JSONObject]]:
    """Each arm's cells, by arm label ("A", "B"), from a measurement."""
    cells = get_object(measured, "cells")
    return {label: get_objects(cells, label) for label in cells}


Ctx = StepContext[AbArgs, World, AbMemo]


class ArmsAreServing(Guard[Ctx]):
    """Each arm is its slot's latest loaded candidate, running unchanged, its binding serving
    exactly its model; the two are different serves of the same model identity."""

    def check(self, ctx: Ctx) -> Refusal | None:
        a, b = ctx.args.arms
        if a.identity.container_id == b.identity.container_id:
            return self.refuse(f"both arms name container {a.identity.container_id[:12]}: nothing to compare")
        if a.identity.model_identity != b.identity.model_identity:
            return self.refuse(
                f"the arms serve different models ({a.identity.model_identity or 'none'} vs "
                f"{b.identity.model_identity or 'none'}): a control compares one checkpoint"
            )
        for arm in (a, b):
            current = ctx.world.store.current_identity(arm.identity.slot, "candidate")
            if current is None or current.container_id != arm.identity.container_id:
                return self.refuse(f"arm {arm.name} is no longer slot {arm.identity.slot}'s loaded candidate")
            problems = serving_problems(ctx.world, arm.identity)
            if problems:
                return self.refuse(f"arm {arm.name} is not what its slot serves: " + "; ".join(problems))
        return None


GUARDS: list[Guard[Ctx]] = [ArmsAreServing()]


def load_ab_profile(name: str) -> tuple[Profile, Capacity]:
    """The profile and its capacity gate (the cells both arms run); BadInput without one."""
    from anvil_ctl.qualify.gates.capacity import Capacity
    from anvil_ctl.qualify.profiles import load_profile

    profile = load_profile(name)
    cells = [g for g in profile.build() if isinstance(g, Capacity)]
    if len(cells) != 1:
        raise BadInput(
            f"profile {profile.name}: an A/B runs exactly one capacity gate's cells; found {len(cells)}",
            field="profile",
        )
    return profile, cells[0]


def _arms(world: World, arms: tuple[AbArm, AbArm]) -> list[Arm]:
    from anvil_ctl.qualify.ab import Arm

    return [
        Arm(
            name=arm.name,
            base_url=world.config.slot(arm.identity.slot).base_url,
            served_model=arm.identity.served_model,
            identity={key: getattr(arm.identity, key) for key in ARM_IDENTITY},
        )
        for arm in arms
    ]


def _writer(ctx: Ctx) -> EvidenceWriter:
    from anvil_ctl.evidence.bundle import EvidenceWriter

    return EvidenceWriter(ctx.world.settings.evidence_dir, ctx.tx_id, resume=True)


def declare(ctx: Ctx) -> StepResult:
    from anvil_ctl.qualify.ab import declaration

    profile, capacity = load_ab_profile(ctx.args.profile)
    body = declaration(
        _arms(ctx.world, ctx.args.arms), capacity, profile.boundaries, profile.ab_metric, profile.name
    )
    artifact = _writer(ctx).write_json("00-declaration.json", body)
    return {
        "digest": body["digest"],
        "artifact": artifact.path,
        "sha256": artifact.sha256,
        "boundaries": [b.describe() for b in profile.boundaries],
        "select": body["select"],
    }


def measure(ctx: Ctx) -> StepResult:
    from anvil_ctl.qualify.ab import run_measure

    _, capacity = load_ab_profile(ctx.args.profile)
    measured = run_measure(_arms(ctx.world, ctx.args.arms), capacity)
    ctx.memo.measured = measured
    cells = _cells(measured)
    writer = _writer(ctx)
    for index, (label, arm) in enumerate(zip("AB", ctx.args.arms, strict=True), start=1):
        writer.write_json(
            f"{index:02d}-arm-{label}-cells.json", {"arm": label, "name": arm.name, "cells": cells[label]}
        )
    writer.write_json("03-order.json", {"order": measured["order"]})
    requests = sum(get_int(c, "requests") or 0 for label in "AB" for c in cells[label])
    return {"requests": requests, "cells": len(cells["A"])}


def compare(ctx: Ctx) -> StepResult:
    from anvil_ctl.qualify.ab import compare as compare_arms

    world, measured = ctx.world, ctx.memo.measured
    if measured is None:
        raise StepFailed("no A/B measurement in this process; rerun `anvilctl qualify --ab`")
    for arm in ctx.args.arms:  # the comparison binds to the arms: they must still be what ran
        problems = serving_problems(world, arm.identity)
        if problems:
            raise StepFailed(f"arm {arm.name} changed during the A/B: " + "; ".join(problems))
    profile, _ = load_ab_profile(ctx.args.profile)
    declared = ctx.results.get("declare") or {}
    result = compare_arms(
        _arms(world, ctx.args.arms), _cells(measured), profile.boundaries, profile.ab_metric
    )
    result["declaration_digest"] = declared.get("digest")
    writer = _writer(ctx)
    artifact = writer.write_json(COMPARISON, result)
    manifest = writer.write_manifest(kind="ab", slot=ctx.args.slot, profile=profile.name)
    # The manifest's own hash binds the directory to this record (`evidence verify`).
    qualification.record_manifest(world.store, ctx.tx_id, manifest.sha256, kind="ab")
    verdict = get_object(result, "verdict")
    tx_dir = Path(writer.tx_dir)
    qualification.record_evidence(
        world.store,
        ctx.tx_id,
        [
            {
                "name": Path(a.path).stem,
                "kind": "policy" if a.path == COMPARISON else "functional",
                "passed": verdict["outcome"] == "selected" if a.path == COMPARISON else True,
                "classification": str(verdict["outcome"]) if a.path == COMPARISON else "raw",
                "artifact": str(tx_dir / a.path),
                "sha256": a.sha256,
                "size": a.size,
            }
            for a in writer.artifacts
        ],
    )
    return {
        "outcome": verdict["outcome"],
        "selected": verdict.get("selected"),
        "summary": verdict["summary"],
        "artifact": artifact.path,
        "manifest_sha256": manifest.sha256,
        "tx_dir": str(tx_dir),
    }


def resolve_arm(world: World, ref: str) -> AbArm:
    """The loaded candidate (of any slot) that `ref` names: recipe name, served model or
    container ID prefix (12+ characters); BadInput naming the arm when none or several match."""
    found: list[Identity] = []
    for slot in sorted(world.config.slots):
        ident = world.store.current_identity(slot, "candidate")
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


def prepare(world: World, req: AbRequest) -> AbArgs:
    """Both arms, each the loaded candidate its reference names, and the profile."""
    if len(req.arms) != 2 or req.arms[0] == req.arms[1]:
        raise BadInput(f"--ab: expected two different arms, got {list(req.arms)}", field="ab")
    world.config.slot(req.slot)
    profile, _ = load_ab_profile(req.profile)
    return AbArgs(
        slot=req.slot,
        arms=(resolve_arm(world, req.arms[0]), resolve_arm(world, req.arms[1])),
        profile=profile.source or profile.name,
    )


def build(args: AbArgs, world: World, _req: object = None) -> Plan[AbArgs, World, AbMemo]:
    slots = sorted({args.slot, *(a.identity.slot for a in args.arms)})
    return Plan(
        kind="ab",
        args=args,
        steps=[
            Step("declare", declare, None, "write the boundaries and both arms; journal their digest"),
            Step("measure", measure, None, "both arms' capacity cells, alternating per repetition"),
            Step("compare", compare, None, "re-check the arms; per-cell deltas and the verdict"),
        ],
        memo=AbMemo(),
        guards=GUARDS,
        slot=args.slot,
        snapshot=lambda: observe(world, slots),
        keeps_serving=False,  # nothing on the host changes
    )
