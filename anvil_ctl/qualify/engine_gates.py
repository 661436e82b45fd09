"""The runner's own gates: the served identity, and the engine still alive after each gate.

`served_identity` asks `GET /v1/models` for the served model; its `max_model_len`, or the
context the caller observed where the engine reports none, bounds long-context gates.
`engine_exited` is the failed `engine-alive` gate a run ends with when the engine died
(the `Liveness` probe said so): it names the gate it died in and the gates not run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.results import GateResult

IDENTITY_GATE = "served-identity"
ENGINE_GATE = "engine-alive"

Liveness = Callable[[], JSONObject | None]
"""None while the engine runs; otherwise what was observed of it (status, exit code)."""


async def served_identity(
    client: EngineClient, served_model: str, context: JSONObject | None = None
) -> tuple[GateResult, int | None]:
    started = time.perf_counter()
    try:
        cards = await client.models()
    except AnvilError as exc:
        evidence: JSONObject = {"error": str(exc), "error_type": type(exc).__name__}
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
        "observed": [*ids],
        "max_model_len": card.max_model_len if card else None,
    }
    passed = card is not None
    summary = f"serves {served_model}" if passed else f"expected {served_model}, engine lists {ids}"
    max_len = card.max_model_len if card else None
    if context is not None:
        # The engine reports no length in /v1/models: the caller observed it another way.
        evidence["context"] = context
        seen = context.get("value")
        if max_len is None and isinstance(seen, int) and not isinstance(seen, bool):
            max_len = seen
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


def engine_exited(during: str, observed: JSONObject, not_run: list[str]) -> GateResult:
    summary = f"the engine stopped during gate {during}: container {observed.get('status')}" + (
        f" with exit code {observed['exit_code']}" if observed.get("exit_code") is not None else ""
    )
    evidence: JSONObject = {"during_gate": during, "observed": observed, "gates_not_run": [*not_run]}
    return GateResult(ENGINE_GATE, False, "functional", "engine_exited", evidence, summary)
