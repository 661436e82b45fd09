"""The qualify transaction, waiver reclassification, evidence export/verify and audit reads.

`qualify_slot` runs a profile against a slot's current candidate (the latest
`candidate` identity, which must be what the slot serves right now), as a
non-mutating transaction `planned -> running -> committed` of two steps:
`run-gates` writes the evidence (`<state>/evidence/<tx>/`), `record-decision`
re-checks the candidate and records every gate row and the decision.

The decision is bound to the candidate Identity's `qualification_digest` (what `promote`
compares with the stored identity). It is computed under the standing policy
(no waivers): that raw decision is never rewritten. When active waivers change
its outcome, a second decision is recorded that `reclassifies` the first, from
the same evidence. `reclassify_decisions` does the same later for every stored
raw decision (the `waive` command calls it), reading the reserve gate's stored
artifact (hash-checked against its evidence row), never re-measuring.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from anvil_ctl.adapters.credentials import TokenKind, resolve_token
from anvil_ctl.commands import transactions
from anvil_ctl.commands.context import Context
from anvil_ctl.commands.recipes import resolve_recipe_path
from anvil_ctl.core.errors import (
    AdapterError,
    AnvilError,
    BadInput,
    CredentialError,
    NotFound,
    StepFailed,
)
from anvil_ctl.core.guards import Guard, Refusal
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_RECIPE, LABEL_SLOT, Identity, sha256_hex
from anvil_ctl.core.steps import Plan, Step, StepContext, StepResult
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.runner import Outcome, TransactionEngine
from anvil_ctl.engine.world import World
from anvil_ctl.gpu import waivers as waiver_policy
from anvil_ctl.gpu.reserve import CardCheck, ReserveResult
from anvil_ctl.persistence import qualification, waivers
from anvil_ctl.qualify import (
    QualificationResult,
    Redaction,
    candidate_identity_digest,
    export_bundle,
    resolve_profile,
    run_qualification,
    verify_bundle,
)
from anvil_ctl.qualify.evidence import ExportResult, VerifyResult
from anvil_ctl.qualify.gates.base import ReserveReading
from anvil_ctl.qualify.report import Progress
from anvil_ctl.recipes import load_recipe, recipe_digest

log = structlog.get_logger()
KIND = "qualify"
PROGRESS_KEY = "qualify_progress"
RESULT_KEY = "qualify_result"
NOW_KEY = "qualify_now"


# -- the candidate and its check --------------------------------------------------------------


def serving_problems(world: World, ident: Identity) -> list[str]:
    """Why `ident` is not what its slot runs and serves right now (empty: it is)."""
    problems: list[str] = []
    try:
        info = world.runtime.inspect(ident.container_id)
    except NotFound:
        return [f"candidate container {ident.container_id[:12]} no longer exists"]
    if not info.running:
        problems.append(f"candidate container {info.id[:12]} is {info.status}, not running")
    if info.image_id != ident.image_id:
        problems.append(f"container image {info.image_id} differs from recorded {ident.image_id}")
    if info.fingerprint != ident.config_fingerprint:
        problems.append("container config fingerprint differs from the recorded identity")
    others = [
        c.id[:12]
        for c in world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: ident.slot})
        if c.running and c.id != ident.container_id
    ]
    if others:
        problems.append(f"other containers run for slot {ident.slot}: {', '.join(others)}")
    base_url = world.config.slot(ident.slot).base_url
    try:
        served = sorted(m.id for m in world.engine.models(base_url))
    except AdapterError as exc:
        return [*problems, f"{base_url}/v1/models did not answer: {exc}"]
    if served != [ident.served_model]:
        problems.append(f"{base_url} serves {served}, expected [{ident.served_model!r}]")
    return problems


class CandidateIsServing(Guard):
    """A slot is qualified only against its latest loaded candidate, while that exact
    container (image, config fingerprint) runs and its binding serves exactly its model."""

    kinds = frozenset({KIND})

    def check(self, ctx: StepContext) -> Refusal | None:
        raw = ctx.args.get("candidate")
        if raw is None:
            return self.refuse(
                f"slot {ctx.args['slot']} has no loaded candidate; run `anvilctl load` first",
                slot=ctx.args["slot"],
            )
        problems = serving_problems(ctx.world, Identity.from_dict(raw))
        if problems:
            return self.refuse("candidate is not what the slot serves: " + "; ".join(problems))
        return None


# -- the plan ---------------------------------------------------------------------------------


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


def _roles(world: World, ident: Identity) -> tuple[str, ...]:
    return tuple(ident.gpu_roles or world.config.slot(ident.slot).gpu_roles)


def _run_gates(ctx: StepContext) -> StepResult:
    world: World = ctx.world
    ident = Identity.from_dict(ctx.args["candidate"])
    profile = resolve_profile(None, profile=ctx.args["profile"], gates=ctx.args["gates"] or None)
    result = run_qualification(
        world.config.slot(ident.slot).base_url,
        ident.served_model,
        profile,
        evidence_dir=world.settings.evidence_dir,
        tx_id=ctx.tx_id,
        identity_digest=ident.qualification_digest,
        reserve_probe=_reserve_probe(world, _roles(world, ident)),
        progress=world.extras.get(PROGRESS_KEY),
    )
    world.extras[RESULT_KEY] = result
    return {
        "tx_dir": result.tx_dir,
        "outcome": result.outcome,
        "manifest_sha256": result.manifest.sha256,
        "gates": len(result.gates),
    }


def _record_decision(ctx: StepContext) -> StepResult:
    world: World = ctx.world
    ident = Identity.from_dict(ctx.args["candidate"])
    result: QualificationResult | None = world.extras.get(RESULT_KEY)
    if result is None:
        raise StepFailed("no qualification result in this process; rerun qualify")
    # The decision binds to the identity: it must still be what ran the whole workload.
    problems = serving_problems(world, ident)
    if problems:
        raise StepFailed("candidate changed during qualification: " + "; ".join(problems))
    tx_dir = Path(result.tx_dir)
    rows = []
    for gate in result.gates:
        art = result.artifact_for(gate.name)
        rows.append(
            {
                "name": gate.name,
                "kind": gate.kind,
                "passed": gate.passed,
                "classification": gate.classification,
                "artifact": str(tx_dir / art.path) if art else "",
                "sha256": art.sha256 if art else "",
                "size": art.size if art else 0,
            }
        )
    qualification.record_evidence(world.store, ctx.tx_id, rows)
    roles = _roles(world, ident)
    now = world.extras.get(NOW_KEY) or datetime.now(UTC)
    standing = {r: world.config.reserve_for(r) for r in roles}
    active = waivers.waivers(world.store)
    decision = result.decision
    raw_id = (
        "dec-"
        + sha256_hex(
            {
                "tx_id": ctx.tx_id,
                "identity_digest": ident.qualification_digest,
                "evidence_sha256": decision.evidence_sha256,
                "outcome": decision.outcome,
            }
        )[:16]
    )
    body = {
        "policy": "standing",
        "qualify_decision": decision.as_dict(),
        "candidate_identity_digest": candidate_identity_digest(
            recipe_digest=ident.recipe_digest or "-",
            image_id=ident.image_id,
            model_identity=ident.model_identity or "-",
            config_fingerprint=ident.config_fingerprint,
        ),
        "recipe_digest": ident.recipe_digest,
        "served_model": ident.served_model,
        "reserve_roles": {world.config.gpu_roles[r].uuid.lower(): r for r in roles},
        "reserve_standing_mib": standing,
        "reserve_in_force_mib": {
            r: waiver_policy.effective_reserve(v, r, ident.recipe_digest or None, active, now)
            for r, v in standing.items()
        },
        "evidence_dir": str(tx_dir),
    }
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
        body=body,
    )
    raw = next(d for d in qualification.decisions(world.store, slot=ident.slot) if d["id"] == raw_id)
    newer = _reclassify_one(world, raw, active, now, tx_id=ctx.tx_id)
    return {
        "decision_id": raw_id,
        "outcome": decision.outcome,
        "identity_digest": ident.qualification_digest,
        "reclassified_id": newer["id"] if newer else None,
        "effective_outcome": newer["outcome"] if newer else decision.outcome,
    }


def build(args: Mapping[str, Any], world: World) -> Plan:
    """The qualify plan (registered as the `qualify` kind; recover rebuilds it from args)."""
    slot = str(args["slot"])
    return Plan(
        kind=KIND,
        args=args,
        steps=[
            Step("run-gates", _run_gates, None, "run the profile's gates; write the evidence"),
            Step(
                "record-decision",
                _record_decision,
                None,
                "re-check the candidate; record gate rows and the decision",
            ),
        ],
        guards=[CandidateIsServing()],
        slot=slot,
        snapshot=lambda: observe(world, [slot]),
        mutates=False,
    )


transactions.register_builder(KIND, build)


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
    args = {
        "slot": slot,
        "candidate": ident.as_dict() if ident else None,
        "profile": resolved.source or resolved.name,
        "gates": list(gates),
    }
    # The World may be shared by several commands of one Context: no stale result or clock.
    for key in (RESULT_KEY, NOW_KEY):
        world.extras.pop(key, None)
    world.extras[PROGRESS_KEY] = progress
    if now is not None:
        world.extras[NOW_KEY] = now
    tx_id = str(uuid.uuid4())
    # Non-mutating: no host lock, but journaled like every transaction.
    outcome = TransactionEngine(ctx.store, ctx.owner).run(build(args, world), world, tx_id=tx_id)
    found = {d["id"]: d for d in qualification.decisions(ctx.store, slot=slot)}
    step = outcome.results.get("record-decision") or {}
    return QualifyOutcome(
        outcome=outcome,
        result=world.extras.get(RESULT_KEY),
        decision=found.get(step.get("decision_id", "")),
        reclassified=found.get(step.get("reclassified_id") or ""),
    )


# -- reclassification under waivers -----------------------------------------------------------


@dataclass(frozen=True)
class _Verdict:
    name: str
    passed: bool


def _artifact_path(world: World, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else world.settings.evidence_dir / p


def stored_verdicts(world: World, raw: Mapping[str, Any]) -> list[Any]:
    """The raw decision's gate verdicts from its evidence rows; reserve gates as ReserveResult
    rebuilt from their artifacts, whose SHA-256 must still match the recorded one."""
    roles: dict[str, str] = raw["body"].get("reserve_roles", {})
    out: list[Any] = []
    for row in qualification.evidence(world.store, raw["tx_id"]):
        if row["kind"] != "policy":
            out.append(_Verdict(row["gate"], row["passed"]))
            continue
        path = _artifact_path(world, row["artifact"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise StepFailed(f"evidence {path} unreadable: {exc}", path=str(path)) from exc
        if sha256_hex(data) != row["sha256"]:
            raise StepFailed(f"evidence {path} does not match its recorded SHA-256")
        cards = json.loads(data)["evidence"].get("cards", [])
        out.append(
            ReserveResult(
                cards=tuple(
                    CardCheck(
                        role=roles.get(c["uuid"].lower(), c["uuid"]),
                        uuid=c["uuid"],
                        threshold_mib=int(c["reserve_mib"]),
                        free_mib=c.get("free_mib"),
                    )
                    for c in cards
                ),
                name=row["gate"],
            )
        )
    return out


def _reclassify_one(
    world: World,
    raw: Mapping[str, Any],
    active: Sequence[waiver_policy.Waiver],
    now: datetime,
    *,
    tx_id: str | None,
) -> dict[str, Any] | None:
    """Record a decision over `raw` when the waivers in force at `now` change the outcome
    last recorded for it; returns the new decision row, or None."""
    store = world.store
    chain = [raw, *(d for d in qualification.decisions(store) if d["reclassifies"] == raw["id"])]
    latest = chain[-1]
    new = waiver_policy.reclassify(
        waiver_policy.Decision(
            id=raw["id"],
            outcome=raw["outcome"],
            identity_digest=raw["identity_digest"],
            evidence_id=raw["tx_id"] or raw["id"],
            recipe_digest=raw["body"].get("recipe_digest") or None,
        ),
        stored_verdicts(world, raw),
        active,
        now,
    )
    if new.outcome == latest["outcome"]:
        return None
    new_id = new.id
    if any(d["id"] == new_id for d in chain):
        # The same verdict was recorded before and superseded since: a new record, new id.
        new_id = "dec-" + sha256_hex([new.id, latest["id"]])[:16]
    qualification.record_decision(
        store,
        decision_id=new_id,
        tx_id=tx_id,
        slot=raw["slot"],
        identity_digest=raw["identity_digest"],
        container_id=raw["container_id"],
        outcome=new.outcome,
        profile=raw["profile"],
        manifest_sha256=raw["manifest_sha256"],
        reclassifies=raw["id"],
        waiver_ids=new.waiver_ids,
        reasons=new.reasons,
        body={**new.as_dict(), "id": new_id, "supersedes": latest["id"]},
    )
    log.info("decision reclassified", raw=raw["id"], new=new_id, outcome=new.outcome)
    return next(d for d in qualification.decisions(store) if d["id"] == new_id)


@dataclass
class ReclassifyReport:
    recorded: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"recorded": self.recorded, "skipped": self.skipped}


def reclassify_decisions(
    ctx: Context, *, slot: str | None = None, now: datetime | None = None
) -> ReclassifyReport:
    """Re-judge every stored raw decision (of `slot`) under the waivers active `now`.

    Records a new decision pointing at each raw one whose last recorded outcome the
    waivers change (a waiver added, expired or revoked); raw evidence is only read.
    """
    world = ctx.world()
    now = now or datetime.now(UTC)
    active = waivers.waivers(ctx.store)
    report = ReclassifyReport()
    for raw in qualification.decisions(ctx.store, slot=slot):
        if raw["reclassifies"] is not None or raw["body"].get("policy") != "standing":
            continue
        try:
            newer = _reclassify_one(world, raw, active, now, tx_id=None)
        except StepFailed as exc:
            report.skipped.append({"decision_id": raw["id"], "reason": str(exc)})
            continue
        if newer is not None:
            report.recorded.append(newer)
    return report


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
