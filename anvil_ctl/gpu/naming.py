"""Role names for GPUs, pinned to UUIDs, never to runtime indexes.

Largest card first, equal ones by lower-case UUID, so a change of enumeration order can never
swap two roles; an override names a UUID and takes it out of the `compute-a`, ... sequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.model import GpuReading

ROLE_PREFIX = "compute-"


def role_name(position: int) -> str:
    """0 -> compute-a, 25 -> compute-z, 26 -> compute-aa (bijective base 26)."""
    letters = ""
    n = position + 1
    while n:
        n, rem = divmod(n - 1, 26)
        letters = chr(ord("a") + rem) + letters
    return ROLE_PREFIX + letters


def assign_role_names(
    readings: Sequence[GpuReading], overrides: Mapping[str, str] | None = None
) -> dict[str, GpuReading]:
    """Role name -> reading, in role order; ConfigError for a repeated UUID, an override of an absent
    GPU, or two GPUs given one name.
    """
    by_uuid = {r.uuid.lower(): r for r in readings}
    if len(by_uuid) != len(readings):
        raise ConfigError("two GPU readings carry the same UUID", field="gpu_roles")
    wanted = {uuid.lower(): name for uuid, name in (overrides or {}).items()}
    for uuid, name in sorted(wanted.items()):
        if uuid not in by_uuid:
            raise ConfigError(
                f"gpu role override {name!r}: no GPU with UUID {uuid}; expected one of {sorted(by_uuid)}",
                field="gpu_roles",
            )
    if len(set(wanted.values())) != len(wanted):
        raise ConfigError("gpu role overrides give two GPUs the same name", field="gpu_roles")

    names: dict[str, GpuReading] = {}
    taken = set(wanted.values())
    position = 0
    for reading in sorted(readings, key=lambda r: (-r.total_mib, r.uuid.lower())):  # not by NVML index
        chosen = wanted.get(reading.uuid.lower())
        if chosen is None:
            while role_name(position) in taken:
                position += 1
            chosen = role_name(position)
            position += 1
        names[chosen] = reading
    return names
