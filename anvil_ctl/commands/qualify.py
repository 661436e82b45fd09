"""The qualify command and the matched A/B control: each runs its plan through the engine's entry
and returns the decisions (or the comparison) it recorded."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from anvil_ctl.bootstrap import App
from anvil_ctl.commands.evidence import router_secrets
from anvil_ctl.commands.recipes import recipe_search
from anvil_ctl.commands.transactions import enter
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.validate import check_duration, require
from anvil_ctl.engine.outcome import Outcome
from anvil_ctl.engine.plans.args import AbRequest, QualifyRequest
from anvil_ctl.engine.plans.qualify import QualifyMemo
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.qualification import DecisionRecord
from anvil_ctl.qualify.runner import Progress, QualificationResult


@dataclass
class _Ran:
    """A transaction's outcome, which the command's answer extends."""

    outcome: Outcome

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    def _outcome_dict(self) -> dict[str, object]:
        o = self.outcome.as_dict()
        return {key: o[key] for key in ("tx_id", "state", "reason", "refusal")}


@dataclass
class QualifyOutcome(_Ran):
    """A qualify transaction's outcome, its result and the decisions it recorded."""

    result: QualificationResult | None = None
    decision: DecisionRecord | None = None
    reclassified: DecisionRecord | None = None

    def as_dict(self) -> dict[str, object]:
        base = self.result.as_dict() if self.result else {}
        chosen = self.reclassified or self.decision
        return {
            **base,
            **self._outcome_dict(),
            "decision": self.decision,
            "reclassified": self.reclassified,
            "effective_outcome": str(chosen["outcome"]) if chosen else None,
        }


def qualify_slot(
    app: App,
    *,
    slot: str,
    profile: str | None = None,
    gates: Sequence[str] = (),
    progress: Progress | None = None,
    timeout_s: float | None = None,
) -> QualifyOutcome:
    """Qualify `slot`'s current candidate, recording evidence and a decision; gates not started
    within `timeout_s` are recorded as failed (timeout)."""
    if timeout_s is not None:
        timeout_s = require("--timeout", check_duration, timeout_s)
    request = QualifyRequest(
        slot=slot,
        profile=profile,
        gates=tuple(gates),
        timeout_s=timeout_s,
        recipe_dirs=tuple(d.path for d in recipe_search(app)),
        progress=progress,
        secrets=router_secrets(app),
    )
    outcome = enter(app, request)
    step = outcome.results.get("record-decision") or {}
    decision_id, reclassified_id = step.get("decision_id"), step.get("reclassified_id")
    return QualifyOutcome(
        outcome=outcome,
        result=outcome.memo.result if isinstance(outcome.memo, QualifyMemo) else None,
        decision=_decision_of(app, decision_id, slot),
        reclassified=_decision_of(app, reclassified_id, slot),
    )


def _decision_of(app: App, decision_id: object, slot: str) -> DecisionRecord | None:
    """The decision `decision_id` names when it is one of `slot`'s, else None."""
    found = qualification.decision(app.store, decision_id) if isinstance(decision_id, str) else None
    return found if found is not None and found["slot"] == slot else None


@dataclass
class AbOutcome(_Ran):
    """An A/B transaction's outcome and, when it ran, its comparison."""

    comparison: JSONObject | None = None
    """The comparison artifact the transaction wrote (`qualify.ab.compare`), as read back."""
    tx_dir: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            **self._outcome_dict(),
            "results": self.outcome.results,
            "comparison": self.comparison,
            "tx_dir": self.tx_dir,
        }


def qualify_ab(app: App, *, slot: str, arms: Sequence[str], profile: str | None = None) -> AbOutcome:
    """Run the matched A/B control of two loaded candidates (see `anvil_ctl.engine.plans.ab`)."""
    if len(arms) != 2:
        raise BadInput(f"--ab: expected two different arms, got {list(arms)}", field="ab")
    outcome = enter(app, AbRequest(slot=slot, arms=(arms[0], arms[1]), profile=profile or "ab-control"))
    compared = outcome.results.get("compare")
    comparison = None
    if compared:
        comparison = json.loads((Path(str(compared["tx_dir"])) / str(compared["artifact"])).read_text())
    return AbOutcome(outcome, comparison, str(compared["tx_dir"]) if compared else None)
