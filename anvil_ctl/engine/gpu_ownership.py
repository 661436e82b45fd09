"""GPU ownership, the guard that keeps GPU starts apart, and the VRAM-release gate."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime

from anvil_ctl.core.errors import AdapterError, StepFailed
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import GpuProcess, GpuReading, VramNeed
from anvil_ctl.core.steps import Guard, Refusal
from anvil_ctl.engine.guards import C
from anvil_ctl.engine.serving import POLL_FIRST_S, inspect_or_none, is_running
from anvil_ctl.engine.world import VramRelease, World
from anvil_ctl.gpu.ownership import (
    GpuOwner,
    Mode,
    OwnershipRefusal,
    check_start,
    unknown_processes,
)
from anvil_ctl.gpu.vram import POLICY as VRAM_RESERVE
from anvil_ctl.gpu.vram import VramReserveGate, wait_for_vram_release
from anvil_ctl.gpu.waiver_policy import resolve
from anvil_ctl.log import get_logger
from anvil_ctl.persistence import gpu_ledger
from anvil_ctl.persistence import waiver_rows as stored_waivers
from anvil_ctl.persistence.store import Store

log = get_logger()


def ownership_mode(roles: Collection[str]) -> Mode:
    """exclusive when one serve spans several roles (tensor parallel), else split."""
    return "exclusive" if len(set(roles)) > 1 else "split"


def ledger(store: Store) -> dict[str, GpuOwner]:
    """role -> GpuOwner, from the ownership events (latest event per role)."""
    return {
        role: GpuOwner(
            container_id=str(o["container_id"]),
            transaction_id=str(o.get("tx_id") or ""),
            mode=o["mode"],
            slot=str(o.get("slot") or ""),
        )
        for role, o in gpu_ledger.gpu_owners(store).items()
    }


StartRequest = tuple[tuple[str, ...], set[str]]
"""(roles a transaction starts a serve on, container IDs it stops or replaces first)."""


def _data(refusal: OwnershipRefusal) -> dict[str, object]:
    return {k: v for k, v in refusal.as_dict().items() if k != "reason"}


class GpuRolesFree(Guard[C]):
    """The roles a serve starts on are free: no owner in the ledger besides the serve it replaces,
    no exclusive owner anywhere, and no process on the cards that no known owner accounts for."""

    def __init__(self, request: Callable[[C], StartRequest | None]) -> None:
        self.request = request

    def check(self, ctx: C) -> Refusal | None:
        request = self.request(ctx)
        if request is None or not request[0]:
            return None
        roles, replacing = request
        world = ctx.world
        owners = ledger(world.store)
        # A claim whose container is stopped (or gone) holds no GPU memory: the start takes it
        # over, and the transaction's ownership step records the new owner.
        replacing = replacing | {
            o.container_id for o in owners.values() if not is_running(world, o.container_id)
        }
        mode = ownership_mode(roles)
        refusal = check_start(owners, roles, mode, replacing=replacing)
        if refusal is None:
            unknown = self._unknown(world, roles, owners, replacing)
            if isinstance(unknown, Refusal):
                return unknown
            refusal = check_start(owners, roles, mode, unknown=unknown, replacing=replacing)
            if refusal is not None:
                return self.refuse(
                    self._describe_strangers(world, refusal.role, refusal.processes),
                    **_data(refusal),
                )
        if refusal is not None:
            return self.refuse(refusal.reason, **_data(refusal))
        return None

    def _unknown(
        self,
        world: World,
        roles: Sequence[str],
        owners: Mapping[str, GpuOwner],
        replacing: Collection[str],
    ) -> dict[str, tuple[GpuProcess, ...]] | Refusal:
        if world.gpus is None:
            return {}
        try:
            readings: list[GpuReading] = world.gpus.gpus()
        except AdapterError as exc:
            return self.refuse(f"cannot tell whether the GPU roles are free: {exc}")
        known = {o.container_id for o in owners.values()} | set(replacing)
        infos = (inspect_or_none(world, cid) for cid in known)
        known_pids = {info.pid for info in infos if info is not None and info.running and info.pid}
        of_pid = world.container_of_pid
        if of_pid is not None:
            known_pids |= {p.pid for r in readings for p in r.processes if of_pid(p.pid) in known}
        uuids = {role: world.config.gpu_roles[role].uuid for role in roles if role in world.config.gpu_roles}
        return unknown_processes(readings, uuids, known_pids)

    def _describe_strangers(self, world: World, role: str, processes: Sequence[GpuProcess]) -> str:
        """Name the container behind each PID where the runtime or /proc can tell."""
        try:
            running = [c for c in world.runtime.list() if c.running and c.pid]
        except AdapterError:
            running = []
        by_pid = {c.pid: f"container {c.id[:12]} ({c.name})" for c in running}
        parts = []
        for p in processes:
            who = by_pid.get(p.pid)
            if who is None and world.container_of_pid is not None:
                cid = world.container_of_pid(p.pid)
                who = f"container {cid[:12]}" if cid else None
            owner = f"{who}, not in the GPU ownership ledger" if who else "no container we know"
            parts.append(f"pid {p.pid} ({p.used_mib} MiB; {owner})")
        return f"GPU role {role} has processes that no known serve owns: " + ", ".join(parts)


def release_all(world: World, container_id: str, tx_id: str) -> list[str]:
    owned = sorted(r for r, o in ledger(world.store).items() if o.container_id == container_id)
    if owned:
        gpu_ledger.release_roles(world.store, owned, container_id=container_id, tx_id=tx_id)
    return owned


def record_ownership(world: World, tx_id: str, identity: Identity, replaced: Identity | None) -> JSONObject:
    """The serve `identity` owns its roles; the serve it replaced (stopped) no longer does."""
    released = []
    if replaced is not None and replaced.container_id != identity.container_id:
        released = release_all(world, replaced.container_id, tx_id)
    owners = ledger(world.store)
    mode = ownership_mode(identity.gpu_roles)
    claimed = [
        r
        for r in sorted(identity.gpu_roles)
        if not (r in owners and owners[r].container_id == identity.container_id and owners[r].mode == mode)
    ]
    if claimed:
        gpu_ledger.claim_roles(
            world.store,
            claimed,
            container_id=identity.container_id,
            tx_id=tx_id,
            mode=mode,
            slot=identity.slot,
        )
    log.info("gpu.ownership_recorded", claimed=claimed, released=released)
    return {"claimed": list(claimed), "released": list(released)}


def release_ownership(world: World, tx_id: str, incumbent: Identity | None) -> JSONObject:
    """Undo `record_ownership` from this transaction's ledger events (safe after a crash, and twice):
    release what it claimed for others than the incumbent, re-claim what it released of it."""
    inc_id = incumbent.container_id if incumbent else None
    events = gpu_ledger.transaction_events(world.store, tx_id)
    released: list[str] = []
    for cid in sorted({e.container_id for e in events if e.event == "claim"} - {inc_id}):
        owned = ledger(world.store)
        mine = sorted(e.role for e in events if e.container_id == cid and e.event == "claim")
        mine = [r for r in mine if r in owned and owned[r].container_id == cid]
        if mine:
            gpu_ledger.release_roles(world.store, mine, container_id=cid, tx_id=tx_id)
            released += mine
    reclaimed: list[str] = []
    if inc_id is not None:
        owned = ledger(world.store)
        lost = {e.role: e for e in events if e.event == "release" and e.container_id == inc_id}
        free = sorted(r for r in lost if r not in owned)
        by_mode: dict[tuple[Mode, str], list[str]] = {}
        for role in free:
            by_mode.setdefault((lost[role].mode, lost[role].slot), []).append(role)
        for (mode, slot), roles in sorted(by_mode.items()):
            gpu_ledger.claim_roles(world.store, roles, container_id=inc_id, tx_id=tx_id, mode=mode, slot=slot)
            reclaimed += roles
    return {"released": list(released), "reclaimed_for_incumbent": list(reclaimed)}


def vram_release_gate(world: World, *, deadline_s: float, poll_s: float) -> VramRelease:
    """The world's VRAM-release gate: per card the serve's need plus the reserve in force."""

    def gate(need: VramNeed) -> JSONObject:
        roles = need.roles
        if not roles:
            return {"skipped": "the serve uses no GPU role"}
        if world.gpus is None:
            return {"skipped": "no GPU probe configured"}
        missing = sorted(set(roles) - set(world.config.gpu_roles))
        if missing:
            raise StepFailed(f"VRAM release: roles not in the host config: {missing}")
        reserve, waiver_ids = reserve_in_force(world, roles, need.recipe_digest)
        result = wait_for_vram_release(
            world.gpus,
            world.clock,
            {r: world.config.gpu_roles[r].uuid for r in roles},
            need_mib=need.need_mib,
            reserve_mib=reserve,
            deadline_s=world.wait(f"VRAM release on {', '.join(roles)}", deadline_s),
            poll_s=poll_s,
            first_poll_s=POLL_FIRST_S,
        )
        return {
            **result,
            "need_mib": need.need_mib,
            "reserve_mib": dict(reserve),
            "waivers": list(waiver_ids),
        }

    return gate


def reserve_in_force(
    world: World, roles: Sequence[str], recipe_digest: str
) -> tuple[dict[str, int], list[str]]:
    """The VRAM reserve per role in force now (waivers applied) and the waivers that set it."""
    waivers = stored_waivers.waivers(world.store)
    when = datetime.now(UTC)
    reserve: dict[str, int] = {}
    waiver_ids: set[str] = set()
    for role in roles:
        eff = resolve(
            VRAM_RESERVE,
            policy_default=world.config.reserve_for(role),
            role=role,
            recipe_digest=recipe_digest or None,
            waivers=waivers,
            now=when,
        )
        reserve[role] = eff.value
        if eff.waiver_id:
            waiver_ids.add(eff.waiver_id)
    return reserve, sorted(waiver_ids)


def reserve_reading(world: World, ident: Identity, *, when: str) -> JSONObject:
    """Free MiB per card of `ident`'s roles now, against the reserve in force (waivers applied);
    `passed` is False when a card keeps less than its reserve or was not reported."""
    roles = tuple(ident.gpu_roles or world.config.slot(ident.slot).gpu_roles)
    if not roles:
        return {"when": when, "skipped": "the serve uses no GPU role", "passed": True}
    if world.gpus is None:
        return {"when": when, "skipped": "no GPU probe configured", "passed": True}
    reserve, waiver_ids = reserve_in_force(world, roles, ident.recipe_digest)
    standing = {role: world.config.reserve_for(role) for role in roles}
    uuids = {role: world.config.gpu_roles[role].uuid for role in roles}
    result = VramReserveGate(reserve, uuids)(world.gpus.gpus())
    return {
        "when": when,
        **result.evidence(),
        "standing_mib": dict(standing),
        "waivers": list(waiver_ids),
    }
