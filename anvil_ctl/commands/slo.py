"""`recheck --slo`: the standing serve sampled through the real route against its thresholds.

The thresholds are the `[watch]` table of the profile that qualified the serve (its newest
decision names it; `--profile` chooses another), made absolute against that qualification's
own capacity evidence (`watchpolicy.qualified_values`, read from the artifact only when its
SHA-256 matches the record) and journaled (`slo.declared`) before the first request. Then
`consecutive` samples are taken `interval_s` apart; a limit failed by every one of them is a
breach, which fails the recheck's `slo` assertion (exit 6).

`--rollback-on-breach` is opt-in and attributed, like a waiver: who enabled it and until when
are given with it (`Enablement`), recorded in the run, and checked when it runs. On a breach
while it is in force, a `rollback` transaction brings back the slot's recorded rollback
identity, following every rule a person's rollback follows; its arguments name the policy,
the enablement and the breaching samples, and the recheck names the transaction. Past `until`
nothing is rolled back and the run says so.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from anvil_ctl.bootstrap import App
from anvil_ctl.core.errors import AnvilError, BadInput
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue, get_object, get_objects
from anvil_ctl.core.validate import check_person, check_text, require, utc_stamp
from anvil_ctl.persistence import qualification
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.slosample import Sample, open_client, sample
from anvil_ctl.qualify.watchpolicy import DEFAULT, WatchPolicy, breaches, qualified_values

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

    def in_force(self, now: datetime) -> bool:
        return now < self.until

    def as_dict(self) -> JSONObject:
        return {
            "policy": POLICY,
            "enabled_by": self.by,
            "until": utc_stamp(self.until),
            "reason": self.reason,
        }


def _standing_policy(app: App, ident: Identity, profile: str | None) -> tuple[WatchPolicy, JSONObject]:
    """The serve's watch policy and where its qualified values come from."""
    decision = qualification.latest_decision(app.store, ident.qualification_digest)
    chosen = profile or (decision["profile"] if decision else None)
    policy = load_profile(chosen).watch if chosen else DEFAULT
    origin: JSONObject = {"decision": decision["id"] if decision else None, "profile": chosen}
    return policy, origin


def _qualified(app: App, ident: Identity) -> tuple[dict[str, float], JSONObject]:
    """The qualified values of the serve's newest qualification, from its verified artifact."""
    decision = qualification.latest_decision(app.store, ident.qualification_digest)
    tx_id = decision["tx_id"] if decision else None
    if not tx_id:
        return {}, {"evidence": None, "why": "no qualification recorded for this serve"}
    for gate in qualification.evidence(app.store, tx_id):
        path = Path(gate["artifact"])
        if not path.is_absolute():
            path = app.settings.evidence_dir / tx_id / path
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        if gate["sha256"] and hashlib.sha256(raw).hexdigest() != gate["sha256"]:
            return {}, {"evidence": str(path), "why": "artifact differs from its recorded SHA-256"}
        try:
            cells = get_objects(get_object(json.loads(raw), "evidence"), "cells")
        except ValueError:
            continue
        if cells and all("concurrency" in c for c in cells):
            return qualified_values(cells), {"evidence": str(path), "gate": gate["gate"], "tx_id": tx_id}
    return {}, {"evidence": None, "tx_id": tx_id, "why": "the qualification measured no capacity cell"}


def slo_check(
    app: App,
    ident: Identity,
    *,
    profile: str | None = None,
    rollback_on_breach: Enablement | None = None,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> tuple[bool, JSONObject]:
    """Sample the slot's route; (held, what was observed) for the recheck's `slo` assertion."""
    from anvil_ctl.adapters.credentials import resolve_credentials

    rc = app.config.router
    if rc.kind == "none":
        return False, {"error": "recheck --slo samples through the router; router.kind is 'none'"}
    policy, origin = _standing_policy(app, ident, profile)
    values, baseline = _qualified(app, ident)
    limits = policy.limits(values)
    alias = app.config.slot(ident.slot).aliases[0]
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
    creds = resolve_credentials(rc, app.env, need_admin=False)
    client = open_client(rc.url, creds.client.reveal())
    samples: list[Sample] = []
    try:
        for n in range(policy.consecutive):
            if n:
                sleep(policy.interval_s)
            samples.append(
                sample(
                    client, alias, requests=policy.requests, max_tokens=policy.max_tokens, clock=time.time()
                )
            )
    finally:
        client.close()
    found = breaches(limits, [s.metrics() for s in samples], policy.consecutive)
    observed: JSONObject = {
        **declared,
        "samples": [s.as_dict() for s in samples],
        "breaches": [*found],
        "rollback": None,
    }
    if found and rollback_on_breach is not None:
        observed["rollback"] = _roll_back(app, ident, rollback_on_breach, found, now())
    return not found, observed


def _roll_back(
    app: App, ident: Identity, enabled: Enablement, found: list[JSONObject], at: datetime
) -> JSONValue:
    if not enabled.in_force(at):
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
