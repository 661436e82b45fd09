"""What a transaction did: the `Outcome` the engine returns and the CLI renders.

`exit_code` comes from the one state -> exit-code map (`core.states.STATE_EXIT_CODES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.snapshot import Change, Snapshot
from anvil_ctl.core.states import STATE_EXIT_CODES, ExitCode, TxState
from anvil_ctl.core.steps import Refusal


@dataclass(frozen=True)
class FollowUp:
    """A transaction that follows this one under the same host lock (a watch's rollback)."""

    request: object
    tx_id: str


@dataclass
class Outcome:
    """What a transaction did; `exit_code` is what the CLI returns for it."""

    kind: str
    state: TxState
    tx_id: str | None = None
    reason: str = ""
    dry_run: bool = False
    plan: list[dict[str, str]] = field(default_factory=list)
    refusal: Refusal | None = None
    before: Snapshot | None = None
    after: Snapshot | None = None
    changes: list[Change] = field(default_factory=list)
    results: dict[str, JSONObject] = field(default_factory=dict)
    memo: object = None
    """The plan's memo after the run: what a step measured that is not journaled."""
    drain_refused: bool = False
    """A drain refused to cut answers at its deadline: compensated, it exits as refused."""
    then: Outcome | None = None
    """What the same command ran right after this one committed (`load --promote`); its exit code."""
    follow_up: FollowUp | None = None
    """What the end state asks the entry to run next under the same lock (a watch's rollback)."""
    followed_by: Outcome | None = None
    """What that follow-up did."""

    @property
    def exit_code(self) -> int:
        if self.then is not None:
            return self.then.exit_code
        if self.drain_refused and self.state is TxState.COMPENSATED:
            return int(ExitCode.REFUSED)
        after = self.followed_by
        if after is not None and after.state is not TxState.COMMITTED:
            return after.exit_code  # the rollback did not bring the incumbent back: its code
        return int(STATE_EXIT_CODES[self.state])

    def as_dict(self) -> dict[str, object]:
        return {
            "tx_id": self.tx_id,
            "kind": self.kind,
            "state": self.state.value,
            "reason": self.reason,
            "dry_run": self.dry_run,
            "plan": self.plan,
            "refusal": self.refusal.as_dict() if self.refusal else None,
            "before_sha256": self.before.sha256 if self.before else None,
            "after_sha256": self.after.sha256 if self.after else None,
            "changes": [c.as_dict() for c in self.changes],
            "results": self.results,
            "followed_by": self.followed_by.as_dict() if self.followed_by else None,
            **({"then": self.then.as_dict()} if self.then is not None else {}),
        }
