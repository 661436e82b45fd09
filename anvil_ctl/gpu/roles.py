"""GPU roles for the host config, named by `anvil_ctl.gpu.naming`, rendered as `[gpu_roles.*]`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from anvil_ctl.config.fields import NAME_RE
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.model import GpuReading
from anvil_ctl.gpu.naming import assign_role_names


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


def render_gpu_roles_toml(roles: Mapping[str, GpuRole]) -> str:
    """The `[gpu_roles.*]` tables of anvil.toml for these roles, in the order given."""
    import tomlkit

    table = tomlkit.table(is_super_table=True)
    for name, role in roles.items():
        fields = role.model_dump()
        table[name] = {
            k: fields[k]
            for k in ("uuid", "capacity_mib", "reserve_mib", "name")
            if fields.get(k) not in (None, "")
        }
    return tomlkit.dumps({"gpu_roles": table})
