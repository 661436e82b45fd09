#!/usr/bin/env python3
"""Check anvil_ctl's NVML probe, role detection and reserve gate against nvidia-smi on real GPUs.

Run from the repository root on a machine with NVIDIA GPUs, nvidia-ml-py and PyTorch:

    PYTHONPATH=. python3 scripts/gpu_check.py [--gib 4] [--reserve-mib 3072]

Three phases: `baseline` (before CUDA is initialised), `held` (this process holds
`--gib` GiB on every card through `torch.empty`), `released` (the tensors freed
and the cache emptied; the CUDA context stays). In each phase the probe's total,
used and free MiB per card are compared with
`nvidia-smi --query-gpu=uuid,memory.total,memory.used,memory.free`, and its
compute processes with `nvidia-smi --query-compute-apps`. The script exits 1 if
any figure differs by more than 1 MiB or any other check fails.

GPU UUIDs are printed redacted (`GPU-` + the first 8 hex of their SHA-256).

Needs nothing beyond the repository, nvidia-ml-py and PyTorch: where structlog or
pydantic are not installed, a no-op logger stands in for structlog and role
detection uses `anvil_ctl.gpu.naming` instead of the pydantic `GpuRole` values.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _shim_structlog() -> bool:
    """A no-op structlog when the real one is absent (the GPU machine has no registry)."""
    if importlib.util.find_spec("structlog") is not None:
        return False

    class _Null:
        def __getattr__(self, _name: str) -> Any:
            return lambda *a, **k: None

    module = types.ModuleType("structlog")
    module.get_logger = lambda *a, **k: _Null()  # type: ignore[attr-defined]
    sys.modules["structlog"] = module
    return True


SHIMMED = _shim_structlog()

from anvil_ctl.adapters.nvml import NvmlProbe
from anvil_ctl.core.model import GpuReading
from anvil_ctl.gpu.naming import assign_role_names
from anvil_ctl.gpu.vram import VramReserveGate

TOLERANCE_MIB = 1
failures: list[str] = []


def redact(uuid: str) -> str:
    return "GPU-" + hashlib.sha256(uuid.lower().encode()).hexdigest()[:8]


def check(ok: bool, what: str) -> str:
    if not ok:
        failures.append(what)
    return "ok" if ok else "FAIL"


def smi_gpus() -> dict[str, tuple[int, int, int]]:
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=uuid,memory.total,memory.used,memory.free",
            "--format=csv,noheader,nounits",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = {}
    for line in out.strip().splitlines():
        uuid, total, used, free = (f.strip() for f in line.split(","))
        rows[uuid.lower()] = (int(total), int(used), int(free))
    return rows


def smi_apps() -> dict[str, dict[int, int | None]]:
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-compute-apps=gpu_uuid,pid,used_memory",
            "--format=csv,noheader,nounits",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    apps: dict[str, dict[int, int | None]] = {}
    for line in out.strip().splitlines():
        if not line.strip() or "No running" in line:
            continue
        uuid, pid, used = (f.strip() for f in line.split(","))
        apps.setdefault(uuid.lower(), {})[int(pid)] = int(used) if used.isdigit() else None
    return apps


def stable_readings(probe: NvmlProbe) -> tuple[list[GpuReading], dict[str, Any], dict[str, Any]]:
    """NVML, then nvidia-smi, then NVML again; retried until both NVML readings agree."""
    for _ in range(5):
        first = probe.gpus()
        smi, apps = smi_gpus(), smi_apps()
        second = probe.gpus()
        if first == second:
            return first, smi, apps
        time.sleep(0.5)
    print("warning: memory kept changing between readings; comparing the last ones")
    return second, smi, apps


def compare(phase: str, probe: NvmlProbe) -> list[GpuReading]:
    t0 = time.perf_counter()
    probe.gpus()
    probe_ms = (time.perf_counter() - t0) * 1000
    readings, smi, apps = stable_readings(probe)
    print(f"\n== {phase}: probe.gpus() took {probe_ms:.1f} ms ==")
    print(f"{'gpu':<13} {'idx':>3} {'field':<6} {'nvml MiB':>10} {'smi MiB':>10} {'diff':>5}  check")
    seen = set()
    for r in readings:
        key = r.uuid.lower()
        seen.add(key)
        row = smi.get(key)
        if row is None:
            print(f"{redact(r.uuid):<13} {r.index:>3} nvidia-smi does not list this GPU  FAIL")
            failures.append(f"{phase}: {redact(r.uuid)} missing from nvidia-smi")
            continue
        for field, ours, theirs in zip(
            ("total", "used", "free"), (r.total_mib, r.used_mib, r.free_mib), row, strict=True
        ):
            diff = ours - theirs
            verdict = check(abs(diff) <= TOLERANCE_MIB, f"{phase}: {redact(r.uuid)} {field} {diff}")
            print(
                f"{redact(r.uuid):<13} {r.index:>3} {field:<6} {ours:>10} {theirs:>10} {diff:>5}  {verdict}"
            )
        ours_p = {p.pid: p.used_mib for p in r.processes}
        theirs_p = apps.get(key, {})
        same_pids = set(ours_p) == set(theirs_p)
        close = all(
            theirs_p[pid] is None or abs(ours_p[pid] - int(theirs_p[pid] or 0)) <= TOLERANCE_MIB
            for pid in set(ours_p) & set(theirs_p)
        )
        verdict = check(same_pids and close, f"{phase}: {redact(r.uuid)} compute processes")
        print(
            f"{redact(r.uuid):<13} {r.index:>3} procs  nvml {sorted(ours_p.values())} "
            f"smi {sorted(v or 0 for v in theirs_p.values())}  {verdict}"
        )
    for key in set(smi) - seen:
        failures.append(f"{phase}: nvidia-smi lists {redact(key)} that NVML did not")
    return readings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=int, default=4, help="GiB to hold on every card")
    parser.add_argument("--reserve-mib", type=int, default=3072, help="policy reserve per card")
    args = parser.parse_args()

    probe = NvmlProbe()
    driver = probe.driver_version()
    smi_driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[0]
    verdict = check(driver == smi_driver, f"driver {driver} vs nvidia-smi {smi_driver}")
    print(f"driver {driver} (nvidia-smi {smi_driver}: {verdict}); structlog shimmed: {SHIMMED}")
    baseline = compare("baseline", probe)

    try:
        from anvil_ctl.gpu.roles import detect_roles, render_gpu_roles_toml

        roles = detect_roles(baseline)
        uuids = {name: role.uuid for name, role in roles.items()}
        toml = render_gpu_roles_toml(roles)
        for reading in baseline:
            toml = toml.replace(reading.uuid, redact(reading.uuid))
        print("\nroles (anvil_ctl.gpu.roles.detect_roles), as TOML:\n" + toml)
    except ImportError as exc:  # pydantic absent on this machine
        names = assign_role_names(baseline)
        uuids = {name: r.uuid for name, r in names.items()}
        print(f"\nroles (naming only; {exc}):")
        for name, r in names.items():
            print(f"  {name}: {redact(r.uuid)} {r.total_mib} MiB {r.name}")
    expected = sorted(baseline, key=lambda r: (-r.total_mib, r.uuid.lower()))
    check(
        [uuids[n] for n in sorted(uuids)] == [r.uuid for r in expected],
        "roles not in capacity/UUID order",
    )

    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch  # type: ignore[import-not-found]

    count = torch.cuda.device_count()
    print(f"\ntorch {torch.__version__}: {count} CUDA devices; holding {args.gib} GiB on each")
    held_tensors = []
    for i in range(count):
        held_tensors.append(torch.empty(args.gib * 2**30, dtype=torch.uint8, device=f"cuda:{i}"))
        torch.cuda.synchronize(i)
    held = compare("held", probe)

    need = args.gib * 1024
    base_by = {r.uuid: r for r in baseline}
    for r in held:
        grew = r.used_mib - base_by[r.uuid].used_mib
        biggest = max((p.used_mib for p in r.processes), default=0)
        mine = [p.used_mib for p in r.processes if p.pid == os.getpid()]
        v1 = check(grew >= need - 1, f"held: {redact(r.uuid)} used grew only {grew} MiB")
        if r.processes:
            v2 = check(biggest >= need - 1, f"held: {redact(r.uuid)} no process holds {need} MiB")
        else:  # a container without the host's PID namespace sees no processes at all
            v2 = "not visible here"
        print(
            f"{redact(r.uuid)}: used grew {grew} MiB (>= {need}: {v1}); largest process "
            f"{biggest} MiB (>= {need}: {v2}); this pid seen by NVML: {bool(mine)}"
        )
    for i in range(count):
        free_b, total_b = torch.cuda.mem_get_info(i)
        print(f"cuda:{i} cudaMemGetInfo free {free_b // 2**20} MiB total {total_b // 2**20} MiB")

    print("\nreserve gate on the held readings:")
    free_by_role = {n: next(r.free_mib for r in held if r.uuid == u) for n, u in uuids.items()}
    cases = [
        ("policy", dict.fromkeys(uuids, args.reserve_mib), None),
        ("boundary free == reserve", free_by_role, True),
        ("one MiB short", {n: f + 1 for n, f in free_by_role.items()}, False),
    ]
    for label, reserve, want in cases:
        result = VramReserveGate(reserve, uuids)(held)
        verdict = "" if want is None else check(result.passed is want, f"reserve gate {label}")
        print(f"  {label}: passed={result.passed} margin={result.margin_mib} MiB {verdict}")
        for c in result.cards:
            print(
                f"    {c.role} {redact(c.uuid)} free {c.free_mib} threshold {c.threshold_mib} "
                f"margin {c.margin_mib}"
            )

    del held_tensors
    torch.cuda.empty_cache()
    for i in range(count):
        torch.cuda.synchronize(i)
    released = compare("released", probe)
    held_by = {r.uuid: r for r in held}
    for r in released:
        dropped = held_by[r.uuid].used_mib - r.used_mib
        v = check(dropped >= need - 1, f"released: {redact(r.uuid)} used dropped only {dropped}")
        print(f"{redact(r.uuid)}: used dropped {dropped} MiB after release (>= {need}: {v})")

    print(f"\n{len(failures)} failure(s)")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
