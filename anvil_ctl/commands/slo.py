"""`recheck --slo`: the standing serve sampled through the real route against its thresholds.

The thresholds are the `[watch]` table of the profile that qualified the serve, made absolute
against its qualification's evidence and journaled before the first request; a limit failed by
every sample is a breach. `--rollback-on-breach` is opt-in and attributed like a waiver; on a
breach while in force it runs a `rollback` transaction under every rule a person's follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from anvil_ctl.bootstrap import App
from anvil_ctl.core.errors import AnvilError, BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.validate import check_person, check_text, require, utc_stamp
from anvil_ctl.engine.watch import Sample, qualified, route_sampler, standing_policy, watch, within

POLICY = "rollback-on-breach"


@dataclass(frozen=True)
class Enablement:
    """Who enabled `--rollback-on-breach`, why, and until when: recorded with every run."""

    by: str
    until: datetime
    reason: str

    def __post_init__(self) -> None:
        require("--by", check_person, self.by)
        require("--reason", lambda r: check_text(r, empty=False), self.reason)
        if self.until.utcoffset() is None:
            raise BadInput("--until: expected a time with a zone (RFC 3339)", field="until")

    def as_dict(self) -> JSONObject:
        return {
            "policy": POLICY,
            "enabled_by": self.by,
            "until": utc_stamp(self.until),
            "reason": self.reason,
        }


def slo_check(
    app: App,
    ident: Identity,
    *,
    profile: str | None = None,
    rollback_on_breach: Enablement | None = None,
) -> tuple[bool, JSONObject]:
    """Sample the slot's route as a watch does; (held, what was observed) for the recheck's
    `slo` assertion."""
    rc = app.config.router
    if rc.kind == "none":
        return False, {"error": "recheck --slo samples through the router; router.kind is 'none'"}
    world = app.world()
    if world.route_sample is None:  # the client key cannot be resolved: the error says why
        from anvil_ctl.adapters.credentials import resolve_credentials

        resolve_credentials(rc, app.env, need_admin=False)
    policy, origin = standing_policy(app.store, ident, profile)
    values, baseline = qualified(app.store, app.settings.evidence_dir, ident)
    limits = policy.limits(values)
    declared: JSONObject = {
        "slot": ident.slot,
        "serve": ident.container_id,
        "policy": policy.as_dict(),
        "origin": origin,
        "qualified": {**values},
        "baseline": baseline,
        "limits": [lim.as_dict() for lim in limits],
        "rollback_on_breach": rollback_on_breach.as_dict() if rollback_on_breach else None,
    }
    app.store.append_audit("slo.declared", None, declared)  # before the first request
    take = route_sampler(world, ident, requests=policy.requests, max_tokens=policy.max_tokens, limits=limits)
    samples: list[Sample] = []
    verdict = watch(
        duration_s=0.0,  # `at_least` samples, then the verdict
        interval_s=policy.interval_s,
        consecutive=policy.consecutive,
        judge=within(limits, policy.consecutive),
        take=take,
        record=samples.append,
        stop=lambda: None,
        at_least=policy.consecutive,
    )
    found = [*verdict.breaches]
    observed: JSONObject = {
        **declared,
        "samples": [dict(s) for s in samples],
        "breaches": [*found],
        "rollback": None,
    }
    if found and rollback_on_breach is not None:
        observed["rollback"] = _roll_back(app, ident, rollback_on_breach, found, datetime.now(UTC))
    return not found, observed


def _roll_back(
    app: App, ident: Identity, enabled: Enablement, found: list[JSONObject], at: datetime
) -> JSONValue:
    if at >= enabled.until:
        return {"ran": False, "why": f"--rollback-on-breach expired at {utc_stamp(enabled.until)}"}
    from anvil_ctl.commands.lifecycle import rollback

    newest = app.store.newest_committed_revision(ident.slot)  # what put the serve on the route
    decided: JSONObject = {
        **enabled.as_dict(),
        "breaches": [*found],
        "serve": ident.container_id,
        "undoes": {"tx_id": newest[0], "kind": newest[1]} if newest else None,
    }
    try:
        out = rollback(app, slot=ident.slot, decided_by=decided)
    except AnvilError as exc:  # refused before it began (the host lock held, say): nothing ran
        return {"ran": False, "why": str(exc)}
    return {"ran": True, "tx_id": out.tx_id, "state": out.state.value, "reason": out.reason}
