"""GPU ownership rules: may a start take these roles, given who owns what now? Pure.

`exclusive`: one serve owns the host's GPUs; `split`: one serve per role. An unknown process on
a requested card refuses the start too. The serve being replaced (`replacing`) does not compete.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import GpuProcess, GpuReading

Mode = Literal["exclusive", "split"]
MODES: tuple[Mode, ...] = ("exclusive", "split")


@dataclass(frozen=True)
class GpuOwner:
    """One ledger entry: the container (and the transaction that started it) owning a role."""

    container_id: str
    transaction_id: str
    mode: Mode
    slot: str = ""

    def describe(self) -> str:
        where = f" in slot {self.slot}" if self.slot else ""
        return f"container {self.container_id[:12]}{where} (transaction {self.transaction_id}, {self.mode})"


@dataclass(frozen=True)
class OwnershipRefusal:
    """Why a start may not have its roles; `str()` is the reason an operator reads."""

    reason: str
    role: str
    owner: GpuOwner | None = None
    processes: tuple[GpuProcess, ...] = ()

    def __str__(self) -> str:
        return self.reason

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "processes": [asdict(p) for p in self.processes]}


def unknown_processes(
    readings: Sequence[GpuReading],
    role_uuids: Mapping[str, str],
    known_pids: Collection[int],
) -> dict[str, tuple[GpuProcess, ...]]:
    """Role -> compute processes on its card whose PID is not in `known_pids` (roles without any omitted)."""
    by_uuid = {r.uuid.lower(): r for r in readings}
    strangers = {
        role: tuple(p for p in by_uuid[uuid.lower()].processes if p.pid not in known_pids)
        for role, uuid in sorted(role_uuids.items())
        if uuid.lower() in by_uuid
    }
    return {role: procs for role, procs in strangers.items() if procs}


def check_start(
    owners: Mapping[str, GpuOwner],
    roles: Sequence[str],
    mode: Mode,
    unknown: Mapping[str, Sequence[GpuProcess]] | None = None,
    replacing: Collection[str] = (),
) -> OwnershipRefusal | None:
    """None when a start of `roles` in `mode` may proceed, else the refusal naming the owner."""
    if mode not in MODES:
        raise BadInput(f"ownership mode {mode!r}: expected one of {MODES}", field="mode")
    current = {role: o for role, o in owners.items() if o.container_id not in replacing}
    wanted = sorted(set(roles))

    # An exclusive owner holds the host's GPUs, whatever roles it named.
    for role, owner in sorted(current.items()):
        if owner.mode == "exclusive":
            return OwnershipRefusal(
                reason=(
                    f"GPU role {role} is owned exclusively by {owner.describe()}; "
                    "no other GPU start is allowed while it owns the GPUs"
                ),
                role=role,
                owner=owner,
            )
    if mode == "exclusive" and wanted:
        for role, owner in sorted(current.items()):
            return OwnershipRefusal(
                reason=(
                    f"an exclusive start needs every GPU role free, but {role} is owned by {owner.describe()}"
                ),
                role=role,
                owner=owner,
            )
    for role in wanted:
        holder = current.get(role)
        if holder is not None:
            return OwnershipRefusal(
                reason=f"GPU role {role} is owned by {holder.describe()}", role=role, owner=holder
            )
    for role in wanted:
        procs = tuple((unknown or {}).get(role, ()))
        if procs:
            listed = ", ".join(f"pid {p.pid} ({p.used_mib} MiB)" for p in procs)
            return OwnershipRefusal(
                reason=f"GPU role {role} has processes that no known serve owns: {listed}",
                role=role,
                processes=procs,
            )
    return None
