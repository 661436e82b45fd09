"""Run a qualification profile against one engine endpoint, write evidence, decide.

Order: the candidate's recorded identity (`identity.json`, when given), the served
identity (`GET /v1/models` must list the served model; its `max_model_len`, or the
context the caller observed where the engine reports none, bounds long-context gates;
an engine with a tokenize endpoint calibrates how many characters make a token, so
prompts are sized in its own tokens), a VRAM reading before the workload
(`vram-before.json`, when a reserve probe is given), then each gate of the
profile, each written as `NN-<gate>.json` as soon as it finishes, then
`summary.json`, `provenance.json` (which figures are local measurements, which
are external-prior claims of the recipe's source), `decision.json` and
`manifest.json`. Nothing here touches the host: qualify mutates nothing, and a
failed gate is evidence, not an exception.

The engine profile says how the engine counts tokens and which of its log lines are
fatal or notices (the log audit reads them there). A `liveness` probe, when given, is
asked after every gate whether the engine is still running; an engine that died ends
the run with a failed `engine-alive` gate naming the cause, and the evidence written
so far is kept and decided on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import structlog

from anvil_ctl.core.engine_profile import OPENAI_COMPATIBLE, EngineProfile
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.decision import Decision, make_decision
from anvil_ctl.qualify.evidence import Artifact, EvidenceWriter
from anvil_ctl.qualify.gates.base import FIXTURES_DIR, GateContext, LogReader, ReserveProbe
from anvil_ctl.qualify.profiles import Profile
from anvil_ctl.qualify.report import NullProgress, Progress, SummaryRow, summary_rows
from anvil_ctl.qualify.results import GateResult

log = structlog.get_logger()
IDENTITY_GATE = "served-identity"
VRAM_BEFORE = "vram-before.json"
IDENTITY = "identity.json"
PROVENANCE = "provenance.json"
ENGINE_GATE = "engine-alive"
CALIBRATION_TOKENS = 1024

Liveness = Callable[[], dict[str, Any] | None]
"""None while the engine runs; otherwise what was observed of it (status, exit code)."""


@dataclass(frozen=True)
class QualificationResult:
    """Everything a qualify run produced; `as_dict()` is the `--json` output."""

    tx_id: str
    profile: str
    base_url: str
    served_model: str
    identity_digest: str
    gates: tuple[GateResult, ...]
    decision: Decision
    artifacts: tuple[Artifact, ...]
    manifest: Artifact
    tx_dir: str
    summary: tuple[SummaryRow, ...]
    started_at: str
    finished_at: str

    @property
    def outcome(self) -> str:
        return self.decision.outcome

    def artifact_for(self, gate: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.path.endswith(f"-{gate}.json")), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tx_id": self.tx_id,
            "profile": self.profile,
            "base_url": self.base_url,
            "served_model": self.served_model,
            "identity_digest": self.identity_digest,
            "outcome": self.outcome,
            "decision": self.decision.as_dict(),
            "gates": [
                {
                    "name": g.name,
                    "kind": g.kind,
                    "passed": g.passed,
                    "classification": g.classification,
                    "summary": g.summary,
                    "duration_s": g.duration_s,
                    "artifact": (a.as_dict() if (a := self.artifact_for(g.name)) else None),
                }
                for g in self.gates
            ],
            "summary": [r.as_dict() for r in self.summary],
            "artifacts": [a.as_dict() for a in self.artifacts],
            "manifest": self.manifest.as_dict(),
            "tx_dir": self.tx_dir,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


async def _calibrate(
    client: EngineClient, engine: EngineProfile, served_model: str, default: float
) -> tuple[float, dict[str, Any]]:
    """Characters per token of the prompt filler, counted by the engine's own tokenizer."""
    if engine.tokenizer is None:
        return default, {"chars_per_token": default, "source": "assumed (no tokenize endpoint)"}
    sample = prompts.filler(CALIBRATION_TOKENS, chars_per_token=default, salt="calibration")
    tok = engine.tokenizer
    try:
        count = await client.tokenize_count(
            tok.path,
            sample,
            input_field=tok.input_field,
            count_field=tok.count_field,
            model_field=tok.model_field,
            model=served_model,
        )
    except AnvilError as exc:
        return default, {"chars_per_token": default, "source": f"assumed: tokenize failed: {exc}"}
    if count <= 0:
        return default, {"chars_per_token": default, "source": f"assumed: tokenizer counted {count}"}
    ratio = round(len(sample) / count, 4)
    return ratio, {"chars_per_token": ratio, "source": tok.path, "chars": len(sample), "tokens": count}


def _counter(
    client: EngineClient, engine: EngineProfile, served_model: str
) -> Callable[[str], Awaitable[int]] | None:
    tok = engine.tokenizer
    if tok is None:
        return None

    async def count(text: str) -> int:
        return await client.tokenize_count(
            tok.path,
            text,
            input_field=tok.input_field,
            count_field=tok.count_field,
            model_field=tok.model_field,
            model=served_model,
        )

    return count


async def _served_identity(
    client: EngineClient, served_model: str, context: dict[str, Any] | None = None
) -> tuple[GateResult, int | None]:
    started = time.perf_counter()
    try:
        cards = await client.models()
    except AnvilError as exc:
        evidence: dict[str, Any] = {"error": str(exc), "error_type": type(exc).__name__}
        return (
            GateResult(
                IDENTITY_GATE,
                False,
                "functional",
                "error",
                evidence,
                str(exc),
                time.perf_counter() - started,
            ),
            None,
        )
    ids = [c.id for c in cards]
    card = next((c for c in cards if c.id == served_model), None)
    evidence = {
        "expected": served_model,
        "observed": ids,
        "max_model_len": card.max_model_len if card else None,
    }
    passed = card is not None
    summary = f"serves {served_model}" if passed else f"expected {served_model}, engine lists {ids}"
    max_len = card.max_model_len if card else None
    if context is not None:
        # The engine reports no length in /v1/models: the caller observed it another way.
        evidence["context"] = context
        max_len = max_len or context.get("value")
    return (
        GateResult(
            IDENTITY_GATE,
            passed,
            "functional",
            "pass" if passed else "wrong_model",
            evidence,
            summary,
            time.perf_counter() - started,
        ),
        max_len,
    )


def _engine_exited(during: str, observed: dict[str, Any], not_run: list[str]) -> GateResult:
    summary = f"the engine stopped during gate {during}: container {observed.get('status')}" + (
        f" with exit code {observed['exit_code']}" if observed.get("exit_code") is not None else ""
    )
    evidence = {"during_gate": during, "observed": observed, "gates_not_run": not_run}
    return GateResult(ENGINE_GATE, False, "functional", "engine_exited", evidence, summary)


async def qualify(
    base_url: str,
    served_model: str,
    profile: Profile,
    *,
    evidence_dir: Path,
    tx_id: str,
    identity_digest: str,
    reserve_probe: ReserveProbe | None = None,
    progress: Progress | None = None,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    fixtures_dir: Path = FIXTURES_DIR,
    chars_per_token: float = 4.0,
    request_timeout_s: float = 600.0,
    container_log: LogReader | None = None,
    engine: EngineProfile = OPENAI_COMPATIBLE,
    secrets: Sequence[str] = (),
    provenance: dict[str, Any] | None = None,
    recorded_identity: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    liveness: Liveness | None = None,
) -> QualificationResult:
    """The async body of `run_qualification`."""
    progress = progress or NullProgress()
    started_at = datetime.now(UTC).isoformat()
    writer = EvidenceWriter(evidence_dir, tx_id)
    gates = profile.build()
    names = [IDENTITY_GATE, *(g.name for g in gates)]
    progress.run_started(profile.name, names)
    results: list[GateResult] = []
    hashes: dict[str, str] = {}
    if recorded_identity is not None:
        writer.write_json(IDENTITY, recorded_identity)

    def record(index: int, result: GateResult) -> None:
        artifact = writer.write_json(f"{index:02d}-{result.name}.json", result.as_dict())
        hashes[result.name] = artifact.sha256
        results.append(result)
        progress.gate_finished(result)
        log.info(
            "gate finished",
            tx=tx_id,
            gate=result.name,
            passed=result.passed,
            classification=result.classification,
        )

    async with EngineClient(
        base_url, api_key=api_key, transport=transport, timeout_s=request_timeout_s
    ) as client:
        progress.gate_started(IDENTITY_GATE, 1, len(names))
        identity, max_model_len = await _served_identity(client, served_model, context)
        if identity.passed:
            chars_per_token, calibration = await _calibrate(client, engine, served_model, chars_per_token)
            identity = replace(
                identity,
                evidence={
                    **identity.evidence,
                    "engine_profile": engine.name,
                    "token_counting": {
                        "streamed_usage": engine.streamed_usage,
                        "prompt_tokens": engine.prompt_tokens,
                        "completion_tokens": engine.completion_tokens,
                    },
                    "prompt_sizing": calibration,
                },
            )
        record(0, identity)
        if identity.passed and reserve_probe is not None:
            writer.write_json(VRAM_BEFORE, await _vram_reading(reserve_probe))
        if identity.passed:
            ctx = GateContext(
                client=client,
                served_model=served_model,
                thinking=profile.thinking,
                max_model_len=max_model_len,
                chars_per_token=chars_per_token,
                fixtures_dir=fixtures_dir,
                reserve_probe=reserve_probe,
                on_request=progress.request_done,
                container_log=container_log,
                engine=engine,
                count_tokens=_counter(client, engine, served_model),
                secrets=tuple(secrets),
            )
            for index, gate in enumerate(gates, start=1):
                progress.gate_started(gate.name, index + 1, len(names))
                record(index, await gate(ctx))
                died = liveness() if liveness is not None else None
                if died is not None:
                    record(index + 1, _engine_exited(gate.name, died, [g.name for g in gates[index:]]))
                    break

    rows = summary_rows(results)
    writer.write_json("summary.json", {"rows": [r.as_dict() for r in rows], "origin": "local"})
    writer.write_json(PROVENANCE, provenance_record(provenance, writer.artifacts))
    decision = make_decision(results, identity_digest, profile=profile.name, artifact_sha256=hashes)
    writer.write_json(
        "decision.json",
        {
            **decision.as_dict(),
            "tx_id": tx_id,
            "served_model": served_model,
            "engine_profile": engine.name,
            "profile_definition": profile.as_dict(),
        },
    )
    finished_at = datetime.now(UTC).isoformat()
    manifest = writer.write_manifest(
        identity_digest=identity_digest,
        outcome=decision.outcome,
        profile=profile.name,
        served_model=served_model,
        started_at=started_at,
        finished_at=finished_at,
    )
    progress.run_finished(decision.outcome)
    return QualificationResult(
        tx_id=tx_id,
        profile=profile.name,
        base_url=base_url,
        served_model=served_model,
        identity_digest=identity_digest,
        gates=tuple(results),
        decision=decision,
        artifacts=tuple(writer.artifacts),
        manifest=manifest,
        tx_dir=str(writer.tx_dir),
        summary=tuple(rows),
        started_at=started_at,
        finished_at=finished_at,
    )


def run_qualification(
    base_url: str,
    served_model: str,
    profile: Profile,
    *,
    evidence_dir: Path,
    tx_id: str,
    identity_digest: str,
    reserve_probe: ReserveProbe | None = None,
    progress: Progress | None = None,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    fixtures_dir: Path = FIXTURES_DIR,
    chars_per_token: float = 4.0,
    request_timeout_s: float = 600.0,
    container_log: LogReader | None = None,
    engine: EngineProfile = OPENAI_COMPATIBLE,
    secrets: Sequence[str] = (),
    provenance: dict[str, Any] | None = None,
    recorded_identity: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    liveness: Liveness | None = None,
) -> QualificationResult:
    """Run `profile` against `base_url`; write evidence under `<evidence_dir>/<tx_id>/`; decide.

    Synchronous wrapper over `qualify`; call it from code that runs no event loop.
    """
    return asyncio.run(
        qualify(
            base_url,
            served_model,
            profile,
            evidence_dir=evidence_dir,
            tx_id=tx_id,
            identity_digest=identity_digest,
            reserve_probe=reserve_probe,
            progress=progress,
            api_key=api_key,
            transport=transport,
            fixtures_dir=fixtures_dir,
            chars_per_token=chars_per_token,
            request_timeout_s=request_timeout_s,
            container_log=container_log,
            engine=engine,
            secrets=secrets,
            provenance=provenance,
            recorded_identity=recorded_identity,
            context=context,
            liveness=liveness,
        )
    )


async def _vram_reading(probe: ReserveProbe) -> dict[str, Any]:
    """Free MiB per card now, against the standing reserve: the idle reading before any workload."""
    try:
        readings = await asyncio.to_thread(probe)
    except AnvilError as exc:
        return {"when": "before the first gate", "cards": [], "error": str(exc)}
    cards = [{"uuid": u, "free_mib": free, "reserve_mib": reserve} for u, free, reserve in readings]
    return {"when": "before the first gate", "cards": cards}


def provenance_record(provenance: dict[str, Any] | None, artifacts: Sequence[Artifact]) -> dict[str, Any]:
    """Which figures of this bundle are local measurements, and which are external-prior.

    Every artifact written so far was measured here against the candidate. The recipe's
    `source` and its `external_prior` figures are copied as they were published, under
    their own key, so a report or a claim can never take one for a local result.
    """
    given = dict(provenance or {})
    source = given.get("source") or None
    external = list((source or {}).get("external_prior") or [])
    return {
        "recipe": given.get("recipe"),
        "engine": given.get("engine"),
        "source": source,
        "local_measurements": {
            "measured_by": "anvilctl qualify, against the candidate's own endpoint and container",
            "artifacts": sorted(a.path for a in artifacts),
        },
        "external_prior": external,
        "rule": "external_prior figures are the recipe source's published claims, not measured "
        "here; never report them as local results",
    }


def select_gates(names: Sequence[str] | None, profile: Profile) -> Profile:
    """`--gates` applied to a profile (kept here for callers that hold a profile already)."""
    return profile.select(names) if names else profile
