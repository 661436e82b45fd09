"""GPU commands: probe readings, role detection into the host config, and waivers (a change of
waivers re-judges stored decisions)."""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from pydantic import ValidationError

from anvil_ctl.atomic import atomic_write
from anvil_ctl.bootstrap import App
from anvil_ctl.config.host import GpuRole, HostConfig
from anvil_ctl.config.inputs import format_validation_error
from anvil_ctl.core.errors import AnvilError, BadInput, ConfigError, StateStoreError
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.core.validate import (
    MAX_MIB,
    check_int,
    check_person,
    check_text,
    parse_rfc3339,
    require,
    utc_stamp,
)
from anvil_ctl.core.waiver import GATE, POLICIES, Waiver
from anvil_ctl.engine.gpu_ownership import ledger
from anvil_ctl.gpu.roles import detect_roles, render_gpu_roles_toml
from anvil_ctl.gpu.waiver_policy import check_gate_waiver, parse_scope
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import waiver_rows

log = get_logger()


def readings(app: App) -> JSONObject:
    """Every GPU the probe sees, by NVML index: the probe's reading, its role (host config) and
    its owner (ledger); and the driver's version."""
    probe = app.gpu_probe()
    config = app.config if app.settings.config.exists() else None
    role_of = {r.uuid.lower(): name for name, r in (config.gpu_roles if config else {}).items()}
    try:  # who owns each GPU role (container_id, slot, mode, transaction_id), from the ledger
        owners = {role: asdict(o) for role, o in ledger(app.store).items()}
    except StateStoreError:
        owners = {}  # no state database yet: nothing owns anything
    rows: JSONArray = [
        {**asdict(g), "role": role, "owner": owners.get(role) if role else None}
        for g in probe.gpus()
        for role in [role_of.get(g.uuid.lower(), "")]
    ]
    return {"driver": probe.driver_version(), "gpus": rows}


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """`UUID=ROLE` strings -> {uuid: role}; BadInput for anything else or a UUID given twice."""
    out: dict[str, str] = {}
    for item in items:
        uuid_, sep, role = item.partition("=")
        if not sep or not uuid_.strip() or not role.strip():
            raise BadInput(f"--override {item!r}: expected UUID=ROLE", field="override")
        key = uuid_.strip().lower()
        if key in out:
            raise BadInput(f"--override: GPU {uuid_.strip()} given twice", field="override")
        out[key] = role.strip()
    return out


def replace_gpu_roles(text: str, roles: Mapping[str, GpuRole]) -> str:
    """`text` (a host config) with its GPU roles replaced by `roles`, written with tomlkit: every
    other key, comment and blank line stays; a kept role is updated in place."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"host config is not valid TOML: {exc}", field="gpu_roles") from None
    table = doc.get("gpu_roles")
    if not isinstance(table, dict):
        table = tomlkit.table(is_super_table=True)
        doc["gpu_roles"] = table
    for name in [n for n in table if n not in roles]:
        del table[name]
    for name, role in roles.items():
        fields = role.model_dump(exclude_none=True, exclude_defaults=True)
        fields["uuid"], fields["capacity_mib"] = role.uuid, role.capacity_mib
        entry = table.get(name)
        if not isinstance(entry, dict):
            table[name] = entry = tomlkit.table()
        for key in [k for k in entry if k not in fields]:
            del entry[key]
        for key in ("uuid", "capacity_mib", "reserve_mib", "name"):
            if key in fields:
                entry[key] = fields[key]
    return tomlkit.dumps(doc)


def detect(
    app: App,
    *,
    overrides: Mapping[str, str] | None = None,
    write: bool = False,
) -> JSONObject:
    """Name the host's GPUs (`gpu.roles.detect_roles`). With `write`, the host config gets exactly
    these `[gpu_roles.*]` tables, a per-card reserve kept, validated before it replaces the file."""
    roles = detect_roles(app.gpu_probe().gpus(), overrides)
    path = app.settings.config
    old_text = path.read_text() if path.exists() else ""
    try:
        old = tomllib.loads(old_text) if old_text else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", file=str(path)) from None
    # An operator's per-card reserve follows its card (by UUID) into the new roles.
    reserves = {
        str(d["uuid"]).lower(): int(d["reserve_mib"])
        for d in (old.get("gpu_roles") or {}).values()
        if isinstance(d, dict) and d.get("uuid") and d.get("reserve_mib") is not None
    }
    roles = {
        name: role
        if (mib := reserves.get(role.uuid.lower())) is None
        else role.model_copy(update={"reserve_mib": mib})
        for name, role in roles.items()
    }
    roles_toml = render_gpu_roles_toml(roles)
    new_text = replace_gpu_roles(old_text, roles) if old_text else roles_toml
    try:
        HostConfig.model_validate(tomllib.loads(new_text))
    except ValidationError as exc:
        raise ConfigError(
            f"{path}: with the detected roles the host config would be invalid: "
            + format_validation_error(path, exc),
            file=str(path),
        ) from None
    changed = new_text != old_text
    if write and changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, new_text)
        log.info("gpu.roles_written", config=str(path), roles=sorted(roles))
    return {
        "config": str(path),
        "written": write and changed,
        "changed": changed,
        "roles": {
            name: r.model_dump(include={"uuid", "capacity_mib", "name", "reserve_mib"})
            for name, r in roles.items()
        },
        "toml": roles_toml,
    }


def _state(w: Waiver, now: datetime) -> str:
    if w.revoked_at is not None and now >= w.revoked_at:
        return "revoked"
    if w.expires_at is not None and now >= w.expires_at:
        return "expired"
    return "active" if w.active(now) else "pending"


def _reclassify(app: App, now: datetime | None = None) -> Mapping[str, object]:
    """Re-judge stored decisions under the waivers in force at `now`, the command's own instant
    (never a later clock reading that a waiver's expiry may already have passed)."""
    from anvil_ctl.engine.reclassify import reclassify_decisions

    try:
        return reclassify_decisions(app.world(), now=now).as_dict()
    except AnvilError as exc:
        # The waiver is recorded either way; say why decisions were not re-judged.
        log.warning("gpu.reclassify_failed", error=str(exc))
        return {"error": str(exc)}


def waive(
    app: App,
    *,
    policy: str,
    scope: str,
    value: int | None,
    approved_by: str,
    reason: str,
    expires: str | None = None,
    no_expiry: bool = False,
    now: datetime | None = None,
    gates: tuple[str, ...] = (),
) -> dict[str, object]:
    """Record a waiver of `policy` to `value` for `scope` (GPU roles or a recipe digest), all of
    it checked first; exactly one of `expires` and `no_expiry` says when it ends. Then decisions
    are re-judged (or {"error": why not})."""
    now = now or datetime.now(UTC)
    if (expires is None) == (not no_expiry):
        raise BadInput(
            "--expires WHEN or --no-expiry: a waiver needs an end, or a person's explicit "
            "choice that it has none (give exactly one)",
            field="expires",
        )
    if policy not in POLICIES:
        raise BadInput(f"--policy {policy!r}: expected one of {list(POLICIES)}", field="policy")
    if policy == GATE:
        value = 0 if value is None else value
        check_gate_waiver(scope, gates, value)
    elif gates:
        raise BadInput(f"--gates: only a {GATE!r} waiver names gates", field="gates")
    if value is None:
        raise BadInput(f"--value: required for the {policy} policy (MiB)", field="value")
    value = require("--value", lambda v: check_int(v, lo=0, hi=MAX_MIB), value)
    approved_by = require("--approved-by", check_person, approved_by)
    reason = require("--reason", lambda r: check_text(r, empty=False), reason)
    roles, digest = parse_scope(scope)
    known = set(app.config.gpu_roles) if roles else set()
    if unknown := sorted(roles - known):
        raise BadInput(
            f"--scope: GPU roles {unknown} are not in the host config; expected among {sorted(known)}",
            field="scope",
        )
    # --expires: an RFC 3339 date (00:00 UTC that day) or date-time (UTC without an offset)
    expires_at = require("--expires", parse_rfc3339, expires) if expires else None
    if expires_at is not None and expires_at <= now:
        raise BadInput(
            f"--expires {expires!r}: {utc_stamp(expires_at)} is not in the future", field="expires"
        )
    waiver = Waiver(
        id="wvr-" + uuid.uuid4().hex[:12],
        policy=policy,
        value=value,
        approved_by=approved_by,
        reason=reason,
        created_at=now,
        roles=roles,
        recipe_digest=digest,
        expires_at=expires_at,
        gates=frozenset(gates),
    )
    waiver_rows.add_waiver(app.store, waiver)
    expiry = "never (--no-expiry)" if waiver.expires_at is None else utc_stamp(waiver.expires_at)
    return {"waiver": waiver.as_dict(), "expiry": expiry, "reclassified": _reclassify(app, now)}


def revoke(app: App, waiver_id: str, *, by: str, reason: str) -> dict[str, object]:
    """Revoke a waiver (a new revocation row; the waiver row stays) and re-judge decisions."""
    by = require("--by", check_person, by)
    reason = require("--reason", lambda r: check_text(r, empty=False), reason)
    waiver_rows.revoke_waiver(app.store, waiver_id, by=by, reason=reason)
    return {"revoked": waiver_id, "by": by, "reclassified": _reclassify(app)}


def list_waivers(app: App, now: datetime | None = None) -> list[dict[str, object]]:
    """Every waiver with its state now: active, expired, revoked (or pending)."""
    now = now or datetime.now(UTC)
    return [{**w.as_dict(), "state": _state(w, now)} for w in waiver_rows.waivers(app.store)]
