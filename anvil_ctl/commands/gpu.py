"""GPU commands: probe readings, role detection into the host config, and waivers.

`readings` and `detect` read the GPUs through the probe the settings choose
(NVML, simulated or the fake backend's); `detect(write=True)` rewrites only the
`[gpu_roles.*]` tables of the host config file, keeping every other line, and
refuses (nothing written) when the result would not be a valid host config,
e.g. a slot naming a role that detection no longer produces. `waive`, `revoke`
and `list_waivers` record and read the attributed policy exceptions; a change
of waivers re-judges stored decisions (`commands.qualify.reclassify_decisions`).
"""

from __future__ import annotations

import importlib
import os
import re
import tempfile
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from anvil_ctl.commands.context import Context
from anvil_ctl.config import GpuRole, HostConfig, format_validation_error
from anvil_ctl.core.errors import AnvilError, BadInput, ConfigError, StateStoreError
from anvil_ctl.core.model import GpuReading
from anvil_ctl.core.ports import GpuProbe
from anvil_ctl.engine.gpu_hooks import ledger
from anvil_ctl.gpu.roles import detect_roles, render_gpu_roles_toml
from anvil_ctl.gpu.waivers import POLICIES, Waiver, parse_scope
from anvil_ctl.persistence import waivers

log = structlog.get_logger()


# -- probe ------------------------------------------------------------------------------------


def gpu_probe(ctx: Context) -> GpuProbe:
    """The probe the settings choose; NVML needs no host config, the simulated GPUs do."""
    if ctx.settings.backend == "fake":
        from anvil_ctl.testing.fakes import FakeGpus, FakeWorld

        return FakeGpus(FakeWorld(ctx.settings.fake_world_path))
    if ctx.settings.gpu == "simulated":
        from anvil_ctl.adapters.docker_runtime import DockerRuntime
        from anvil_ctl.testing.gpu import SimulatedGpuProbe

        runtime = DockerRuntime(base_url=ctx.settings.docker_host, gpu_mode="simulated")
        return SimulatedGpuProbe(ctx.config.gpu_roles, runtime)
    from anvil_ctl.adapters.nvml import NvmlProbe

    return NvmlProbe()


def _optional_config(ctx: Context) -> HostConfig | None:
    if not ctx.settings.config.exists():
        return None
    return ctx.config


def _optional_owners(ctx: Context) -> dict[str, Any]:
    try:
        return {
            role: {
                "container_id": o.container_id,
                "slot": o.slot,
                "mode": o.mode,
                "transaction_id": o.transaction_id,
            }
            for role, o in ledger(ctx.store).items()
        }
    except StateStoreError:
        return {}  # no state database yet: nothing owns anything


def readings(ctx: Context) -> dict[str, Any]:
    """Every GPU the probe sees, with its role (host config) and owner (ledger), by NVML index."""
    probe = gpu_probe(ctx)
    gpus = probe.gpus()
    config = _optional_config(ctx)
    role_of = {r.uuid.lower(): name for name, r in (config.gpu_roles if config else {}).items()}
    owners = _optional_owners(ctx)
    rows = []
    for g in gpus:
        role = role_of.get(g.uuid.lower(), "")
        rows.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "role": role,
                "total_mib": g.total_mib,
                "used_mib": g.used_mib,
                "free_mib": g.free_mib,
                "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in g.processes],
                "owner": owners.get(role) if role else None,
            }
        )
    return {"driver": probe.driver_version(), "gpus": rows}


# -- role detection ---------------------------------------------------------------------------


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


_TABLE_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _is_roles_header(key: str) -> bool:
    first = key.split(".", 1)[0].strip().strip('"').strip("'")
    return first == "gpu_roles"


def replace_gpu_roles(text: str, roles_toml: str) -> str:
    """`text` (a host config) with its `[gpu_roles.*]` tables replaced by `roles_toml`.

    Every other line stays as it was. The new tables go where the first old one
    was, or at the end. A `gpu_roles = {...}` written inline cannot be located
    line by line: ConfigError.
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    inserted_at: int | None = None
    skipping = False
    top_level = True
    for line in lines:
        header = _TABLE_RE.match(line)
        if header:
            top_level = False
            skipping = _is_roles_header(header.group(1))
            if skipping and inserted_at is None:
                inserted_at = len(out)
            if skipping:
                continue
        elif skipping:
            continue
        elif top_level and re.match(r"^\s*gpu_roles\s*[.=]", line):
            raise ConfigError(
                "gpu_roles are written inline at the top of the host config; "
                "write them as [gpu_roles.NAME] tables or remove them first",
                field="gpu_roles",
            )
        out.append(line)
    block = roles_toml if roles_toml.endswith("\n") else roles_toml + "\n"
    if inserted_at is None:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        if out and out[-1].strip():
            out.append("\n")
        out.append(block)
    else:
        if inserted_at < len(out) and out[inserted_at].strip():
            block += "\n"
        out.insert(inserted_at, block)
    return "".join(out)


def _keep_reserves(new: dict[str, GpuRole], old: Mapping[str, Any]) -> dict[str, GpuRole]:
    """An operator's per-card reserve follows its card (by UUID) into the new roles."""
    reserves = {}
    for data in old.values():
        if isinstance(data, dict) and data.get("uuid") and data.get("reserve_mib") is not None:
            reserves[str(data["uuid"]).lower()] = int(data["reserve_mib"])
    return {name: replace_role(role, reserves.get(role.uuid.lower())) for name, role in new.items()}


def replace_role(role: GpuRole, reserve_mib: int | None) -> GpuRole:
    return role if reserve_mib is None else role.model_copy(update={"reserve_mib": reserve_mib})


def _write_atomically(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def detect(
    ctx: Context,
    *,
    overrides: Mapping[str, str] | None = None,
    write: bool = False,
    gpus: Sequence[GpuReading] | None = None,
) -> dict[str, Any]:
    """Name the host's GPUs (largest first, equal cards by UUID; overrides by UUID).

    With `write`, the host config file gets exactly these `[gpu_roles.*]` tables
    (created with only them if it does not exist); a reserve set per card is
    kept for the same UUID. The new file is validated as a host config before
    it replaces the old one atomically; nothing is written on any error.
    """
    found = list(gpus) if gpus is not None else gpu_probe(ctx).gpus()
    roles = detect_roles(found, overrides)
    path = ctx.settings.config
    old_text = path.read_text() if path.exists() else ""
    try:
        old = tomllib.loads(old_text) if old_text else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", file=str(path)) from None
    roles = _keep_reserves(roles, old.get("gpu_roles") or {})
    roles_toml = render_gpu_roles_toml(roles)
    new_text = replace_gpu_roles(old_text, roles_toml) if old_text else roles_toml
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
        _write_atomically(path, new_text)
        log.info("gpu.roles_written", config=str(path), roles=sorted(roles))
    return {
        "config": str(path),
        "written": write and changed,
        "changed": changed,
        "roles": {
            name: {
                "uuid": r.uuid,
                "capacity_mib": r.capacity_mib,
                "name": r.name,
                "reserve_mib": r.reserve_mib,
            }
            for name, r in roles.items()
        },
        "toml": roles_toml,
    }


# -- waivers ----------------------------------------------------------------------------------


def parse_expiry(text: str, now: datetime) -> datetime:
    """`--expires`: an ISO date (the waiver ends at 00:00 UTC that day) or an ISO date-time
    (UTC when it names no zone). BadInput unless it lies after `now`."""
    try:
        if len(text.strip()) == 10:
            when = datetime.combine(date.fromisoformat(text.strip()), time(0, 0), tzinfo=UTC)
        else:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"--expires {text!r}: expected an ISO date (2026-12-31) or date-time (2026-12-31T18:00:00Z)",
            field="expires",
        ) from None
    if when.utcoffset() is None:
        when = when.replace(tzinfo=UTC)
    if when <= now:
        raise BadInput(f"--expires {text!r}: {when.isoformat()} is not in the future", field="expires")
    return when


def _state(w: Waiver, now: datetime) -> str:
    if w.revoked_at is not None and now >= w.revoked_at:
        return "revoked"
    if w.expires_at is not None and now >= w.expires_at:
        return "expired"
    return "active" if w.active(now) else "pending"


def _reclassify(ctx: Context) -> dict[str, Any] | None:
    """Re-judge stored decisions under the waivers now in force (when qualify is installed)."""
    try:
        qualify = importlib.import_module("anvil_ctl.commands.qualify")
    except ModuleNotFoundError as exc:
        if exc.name != "anvil_ctl.commands.qualify":
            raise
        return None
    fn = getattr(qualify, "reclassify_decisions", None)
    if fn is None:
        return None
    try:
        report = fn(ctx)
    except AnvilError as exc:
        # The waiver is recorded either way; say why decisions were not re-judged.
        log.warning("gpu.reclassify_failed", error=str(exc))
        return {"error": str(exc)}
    data: dict[str, Any] = report.as_dict() if hasattr(report, "as_dict") else dict(report)
    return data


def waive(
    ctx: Context,
    *,
    policy: str,
    scope: str,
    value: int,
    approved_by: str,
    reason: str,
    expires: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Record a waiver of `policy` to `value` for `scope` (GPU roles or a recipe digest).

    Everything is checked before the write: the policy is known, the scope names
    roles of the host config (or is a recipe digest), the value is >= 0, the
    approver and reason are given and the expiry lies ahead. Then stored
    decisions are re-judged under the waivers in force.
    """
    now = now or datetime.now(UTC)
    if policy not in POLICIES:
        raise BadInput(f"--policy {policy!r}: expected one of {list(POLICIES)}", field="policy")
    if value < 0:
        raise BadInput(f"--value {value}: expected MiB >= 0", field="value")
    roles, digest = parse_scope(scope)
    if roles:
        known = set(ctx.config.gpu_roles)
        unknown = sorted(roles - known)
        if unknown:
            raise BadInput(
                f"--scope: GPU roles {unknown} are not in the host config; expected among {sorted(known)}",
                field="scope",
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
        expires_at=parse_expiry(expires, now) if expires else None,
    )
    waivers.add_waiver(ctx.store, waiver)
    return {"waiver": waiver.as_dict(), "reclassified": _reclassify(ctx)}


def revoke(ctx: Context, waiver_id: str, *, by: str, reason: str) -> dict[str, Any]:
    """Revoke a waiver (a new revocation row; the waiver row stays) and re-judge decisions."""
    if not by.strip():
        raise BadInput("--by: expected who revokes the waiver", field="by")
    if not reason.strip():
        raise BadInput("--reason: expected why the waiver is revoked", field="reason")
    waivers.revoke_waiver(ctx.store, waiver_id, by=by, reason=reason)
    return {"revoked": waiver_id, "by": by, "reclassified": _reclassify(ctx)}


def list_waivers(ctx: Context, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every waiver with its state now: active, expired, revoked (or pending)."""
    now = now or datetime.now(UTC)
    return [{**w.as_dict(), "state": _state(w, now)} for w in waivers.waivers(ctx.store)]
