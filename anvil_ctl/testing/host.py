"""Fake GPUs and shared memory over the fake world, and an in-memory shared-memory ledger."""

from __future__ import annotations

from anvil_ctl.core.model import GpuReading, ResidueFile, ResidueRemoval, ShmMark
from anvil_ctl.testing.world import FakeWorld


class FakeGpus:
    """GPU readings: each running fake container holds its FAKE_VRAM_MIB on each of its GPUs."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def gpus(self) -> list[GpuReading]:
        w = self.world.read()
        readings = []
        for i, g in enumerate(w["gpus"]):
            used = sum(
                c["vram_mib"]
                for c in w["containers"].values()
                if c["status"] == "running" and g["uuid"] in c["gpu_uuids"]
            )
            readings.append(GpuReading(g["uuid"], g["name"], i, g["total_mib"], used, g["total_mib"] - used))
        return readings

    def driver_version(self) -> str:
        return "fake"


class FakeSharedMemory:
    """SharedMemory over the fake world's `residue` list, with the real adapter's rule.

    An entry is `{"path", "size"}`, optionally `"pids"` (held: not residue yet) and `"ours": false`
    (another program's file: never reported, never removed).
    """

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def residue(self) -> list[ResidueFile]:
        return [
            ResidueFile(r["path"], r["size"])
            for r in self.world.read()["residue"]
            if r.get("ours", True) and not r.get("pids")
        ]

    def remove_unheld(self) -> ResidueRemoval:
        """Our unheld files go; held ones stay with the reason; other programs' are untouched."""
        with self.world.edit() as w:
            ours = [r for r in w["residue"] if r.get("ours", True)]
            removed = tuple(r["path"] for r in ours if not r.get("pids"))
            kept = tuple(
                (r["path"], f"mapped or open by pids {sorted(r['pids'])}") for r in ours if r.get("pids")
            )
            w["residue"] = [r for r in w["residue"] if not r.get("ours", True) or r.get("pids")]
        return ResidueRemoval(removed=removed, kept=kept)


class MemoryShmLedger:
    """ShmLedger in memory: what a scanner marked, for tests of the residue rule."""

    def __init__(self, marks: list[ShmMark] | None = None) -> None:
        self.recorded: list[ShmMark] = list(marks or [])

    def marks(self, boot_id: str) -> list[ShmMark]:
        return [m for m in self.recorded if m.boot_id == boot_id]

    def remember(self, marks: list[ShmMark]) -> None:
        """Like the store: one mark per (boot, path, device, inode), the first holder's."""
        known = {(m.boot_id, m.path, m.dev, m.ino) for m in self.recorded}
        for m in marks:
            if (m.boot_id, m.path, m.dev, m.ino) not in known:
                known.add((m.boot_id, m.path, m.dev, m.ino))
                self.recorded.append(m)
