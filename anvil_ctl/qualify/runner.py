"""Run a qualification profile against one engine endpoint, write evidence, decide: `identity.json`,
`vram-before.json`, `NN-<gate>.json` as each gate finishes, then `summary.json`, `provenance.json`,
`decision.json` and `manifest.json`. A failed gate is evidence, not an exception; an engine that
dies mid-run ends it with a failed `engine-alive` gate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx
from tenacity import AsyncRetrying, retry_if_result, stop_after_delay, wait_fixed

from anvil_ctl.core.engine_profile import OPENAI_COMPATIBLE, EngineProfile
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONArray, JSONObject, fields, items
from anvil_ctl.core.validate import utc_stamp
from anvil_ctl.evidence.bundle import Artifact, EvidenceWriter
from anvil_ctl.evidence.summary import SummaryRow, summary_rows
from anvil_ctl.log import get_logger
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.decision import Decision, make_decision
from anvil_ctl.qualify.gates.base import Gate, GateContext, LogReader, ReserveProbe
from anvil_ctl.qualify.profiles import Profile
from anvil_ctl.qualify.results import GateResult
from anvil_ctl.qualify.tokens import calibrate

log = get_logger()

IDENTITY_GATE = "served-identity"
ENGINE_GATE = "engine-alive"
Liveness = Callable[[], JSONObject | None]
"""None while the engine runs; otherwise what was observed of it (status, exit code)."""


class Progress(Protocol):
    """What the runner reports while it works (the CLI's `GateProgress` shows it)."""

    def run_started(self, profile: str, gates: Sequence[str]) -> None:
        return None

    def gate_started(self, name: str, index: int, total: int) -> None:
        return None

    def request_done(self, gate: str, ok: bool, detail: str) -> None:
        return None

    def gate_finished(self, result: GateResult) -> None:
        return None

    def run_finished(self, outcome: str) -> None:
        return None


class NullProgress(Progress):
    """Reports nothing (library callers, --json)."""


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

    def as_dict(self) -> JSONObject:
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
                    "artifact": (asdict(a) if (a := self.artifact_for(g.name)) else None),
                }
                for g in self.gates
            ],
            "summary": [asdict(r) for r in self.summary],
            "artifacts": [asdict(a) for a in self.artifacts],
            "manifest": asdict(self.manifest),
            "tx_dir": self.tx_dir,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


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
    transport: httpx.AsyncBaseTransport | None = None,
    container_log: LogReader | None = None,
    engine: EngineProfile = OPENAI_COMPATIBLE,
    secrets: Sequence[str] = (),
    provenance: Mapping[str, object] | None = None,
    recorded_identity: JSONObject | None = None,
    timeout_s: float | None = None,
    context: JSONObject | None = None,
    liveness: Liveness | None = None,
) -> QualificationResult:
    """Run `profile` against `base_url`; write evidence under `<evidence_dir>/<tx_id>/`; decide. A
    gate that would start after `timeout_s` is recorded as failed (`timeout`), so the decision can
    never say an incomplete run passed."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    request_timeout_s = 600.0 if timeout_s is None else min(600.0, timeout_s)
    progress = progress or NullProgress()
    started_at = utc_stamp(datetime.now(UTC))
    writer = EvidenceWriter(evidence_dir, tx_id)
    gates = profile.build()
    names = [IDENTITY_GATE, *(g.name for g in gates)]
    progress.run_started(profile.name, names)
    results: list[GateResult] = []
    hashes: dict[str, str] = {}
    if recorded_identity is not None:
        writer.write_json("identity.json", recorded_identity)

    def record(index: int, result: GateResult) -> None:
        artifact = writer.write_json(f"{index:02d}-{result.name}.json", asdict(result))
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

    async def run_gates() -> None:
        async with EngineClient(base_url, transport=transport, timeout_s=request_timeout_s) as client:
            progress.gate_started(IDENTITY_GATE, 1, len(names))
            identity, max_model_len, chars_per_token = await served_identity(
                client, served_model, context, engine
            )
            record(0, identity)
            if identity.passed:
                if reserve_probe is not None:
                    writer.write_json("vram-before.json", await _vram_reading(reserve_probe))
                gate_ctx = GateContext(
                    client=client,
                    served_model=served_model,
                    thinking=profile.thinking,
                    max_model_len=max_model_len,
                    chars_per_token=chars_per_token,
                    reserve_probe=reserve_probe,
                    on_request=progress.request_done,
                    container_log=container_log,
                    engine=engine,
                    secrets=tuple(secrets),
                )
                for index, gate in enumerate(gates, start=1):
                    progress.gate_started(gate.name, index + 1, len(names))
                    if end is not None and time.monotonic() >= end:
                        record(index, _timed_out(gate, timeout_s or 0.0))
                        continue
                    result = await gate(gate_ctx)
                    record(index, result)
                    died = None if liveness is None else await _died(liveness, client, result.passed)
                    if died is not None:
                        record(index + 1, engine_exited(gate.name, died, [g.name for g in gates[index:]]))
                        break

    asyncio.run(run_gates())
    rows = summary_rows(r.evidence for r in results)
    writer.write_json("summary.json", {"rows": [asdict(r) for r in rows], "origin": "local"})
    writer.write_json("provenance.json", provenance_record(provenance, writer.artifacts))
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
    finished_at = utc_stamp(datetime.now(UTC))
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


async def served_identity(
    client: EngineClient,
    served_model: str,
    context: JSONObject | None,
    engine: EngineProfile,
    chars_per_token: float = 4.0,
) -> tuple[GateResult, int | None, float]:
    """The runner's first gate: `GET /v1/models` lists the served model. Its `max_model_len`,
    or the context the caller observed where the engine reports none, bounds long-context
    gates; once it passes, the engine's tokenizer calibrates the characters per token of prompts
    (both returned beside the result)."""
    started = time.perf_counter()
    try:
        cards = await client.models()
    except AnvilError as exc:
        evidence: JSONObject = {"error": str(exc), "error_type": type(exc).__name__}
        elapsed = time.perf_counter() - started
        failed = GateResult(IDENTITY_GATE, False, "functional", "error", evidence, str(exc), elapsed)
        return failed, None, chars_per_token
    ids = [c.id for c in cards]
    card = next((c for c in cards if c.id == served_model), None)
    max_len = card.max_model_len if card else None
    evidence = {"expected": served_model, "observed": [*ids], "max_model_len": max_len}
    if context is not None:
        evidence["context"] = context
        seen = context.get("value")
        if max_len is None and isinstance(seen, int) and not isinstance(seen, bool):
            max_len = seen
    passed = card is not None
    summary = f"serves {served_model}" if passed else f"expected {served_model}, engine lists {ids}"
    elapsed = time.perf_counter() - started
    if passed:
        chars_per_token, calibration = await calibrate(client, engine, served_model, chars_per_token)
        evidence["engine_profile"] = engine.name
        evidence["token_counting"] = {
            "streamed_usage": engine.streamed_usage,
            "prompt_tokens": engine.prompt_tokens,
            "completion_tokens": engine.completion_tokens,
        }
        evidence["prompt_sizing"] = calibration
    classification = "pass" if passed else "wrong_model"
    result = GateResult(IDENTITY_GATE, passed, "functional", classification, evidence, summary, elapsed)
    return result, max_len, chars_per_token


DEATH_GRACE_S = 5.0
"""How long the runtime is asked again about an engine that failed a gate and no longer answers:
its requests fail the moment it is killed, the runtime reports its container exited a moment later."""


async def _died(liveness: Liveness, client: EngineClient, passed: bool) -> JSONObject | None:
    """What the runtime says of an engine that died during the gate just run (None: it lives)."""
    died = liveness()
    if died is not None or passed:
        return died
    try:
        await client.models(timeout_s=DEATH_GRACE_S)
        return None  # it answers: the gate failed on its own
    except AnvilError:
        pass
    retrying = AsyncRetrying(
        stop=stop_after_delay(DEATH_GRACE_S),
        wait=wait_fixed(0.1),
        retry=retry_if_result(lambda found: found is None),
        retry_error_callback=lambda state: None,
    )
    found: JSONObject | None = await retrying(asyncio.to_thread, liveness)
    return found


def engine_exited(during: str, observed: JSONObject, not_run: list[str]) -> GateResult:
    """The failed `engine-alive` gate a run ends with when the `Liveness` probe saw the engine
    die: it names the gate it died in and the gates not run."""
    summary = f"the engine stopped during gate {during}: container {observed.get('status')}" + (
        f" with exit code {observed['exit_code']}" if observed.get("exit_code") is not None else ""
    )
    evidence: JSONObject = {"during_gate": during, "observed": observed, "gates_not_run": [*not_run]}
    return GateResult(ENGINE_GATE, False, "functional", "engine_exited", evidence, summary)


def _timed_out(gate: Gate, timeout_s: float) -> GateResult:
    why = f"not started: the qualification's --timeout of {timeout_s:g} s was reached"
    return gate.result(False, "timeout", {"not_started": True, "timeout_s": timeout_s}, why)


async def _vram_reading(probe: ReserveProbe) -> JSONObject:
    """Free MiB per card now, against the standing reserve: the idle reading before any workload."""
    try:
        readings = await asyncio.to_thread(probe)
    except AnvilError as exc:
        return {"when": "before the first gate", "cards": [], "error": str(exc)}
    cards: JSONArray = [
        {"uuid": u, "free_mib": free, "reserve_mib": reserve} for u, free, reserve in readings
    ]
    return {"when": "before the first gate", "cards": cards}


def provenance_record(
    provenance: Mapping[str, object] | None, artifacts: Sequence[Artifact]
) -> dict[str, object]:
    """Which figures of this bundle are local measurements, and which the recipe's published
    `external_prior` ones, kept under their own key so none is taken for a local result."""
    given = dict(provenance or {})
    source = given.get("source") or None
    external = items(fields(source or {}).get("external_prior"))
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


def render_gates(results: Sequence[GateResult]) -> str:
    """One line per gate: verdict, kind, classification, summary."""
    width = max((len(r.name) for r in results), default=4)
    return "\n".join(
        f"{r.name.ljust(width)}  {'PASS' if r.passed else 'FAIL'}  {r.kind:<10}  "
        f"{r.classification:<32}  {r.summary}".rstrip()
        for r in results
    )
