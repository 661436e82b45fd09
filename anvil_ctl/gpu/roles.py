"""GPU roles for the host config, named by `anvil_ctl.gpu.naming`, rendered as `[gpu_roles.*]`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from anvil_ctl.config.fields import NAME_RE
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.model import GpuReading
from anvil_ctl.gpu.naming import assign_role_names

_BARE_KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


def detect_roles(
    readings: Sequence[GpuReading], overrides: Mapping[str, str] | None = None
) -> dict[str, GpuRole]:
    """Name every GPU (`overrides`: UUID -> role name); ConfigError for an absent or MIG UUID, or a
    repeated or invalid name.
    """
    for name in (overrides or {}).values():
        if not NAME_RE.match(name):
            raise ConfigError(
                f"gpu role override {name!r}: expected lowercase letters, digits, '.', '_' or '-'",
                field="gpu_roles",
            )
    names = assign_role_names(readings, overrides)
    roles: dict[str, GpuRole] = {}
    for name, reading in names.items():
        try:
            roles[name] = GpuRole(uuid=reading.uuid, capacity_mib=reading.total_mib, name=reading.name)
        except ValidationError as exc:
            raise ConfigError(
                f"GPU {reading.uuid} ({reading.name}) cannot be a role: {exc.errors()[0]['msg']}",
                field="gpu_roles",
            ) from None
    return roles


def _key(name: str) -> str:
    return name if name and all(c in _BARE_KEY for c in name) else json.dumps(name)


def _string(value: str) -> str:
    # JSON string escapes are a subset of TOML basic-string escapes.
    return json.dumps(value, ensure_ascii=False)


def render_gpu_roles_toml(roles: Mapping[str, GpuRole]) -> str:
    """The `[gpu_roles.*]` tables of anvil.toml for these roles, in the order given."""
    blocks = []
    for name, role in roles.items():
        lines = [f"[gpu_roles.{_key(name)}]", f"uuid = {_string(role.uuid)}"]
        lines.append(f"capacity_mib = {role.capacity_mib}")
        if role.reserve_mib is not None:
            lines.append(f"reserve_mib = {role.reserve_mib}")
        if role.name:
            lines.append(f"name = {_string(role.name)}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)
