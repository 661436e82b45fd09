"""A real qualification's evidence bundle for report tests: the stub engine as a local process,
the demo profile's workload gates, a simulated reserve probe (3,351 MiB idle, then 2,101 after
the workload, as in the seeds), the stub's log, a recipe source with an external-prior figure."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from anvil_ctl.core.engine_profile import STUB
from anvil_ctl.core.model import ContainerLog
from anvil_ctl.qualify.gates.base import FIXTURES_DIR
from anvil_ctl.qualify.profiles import load_profile
from anvil_ctl.qualify.runner import run_qualification

REPO = Path(__file__).resolve().parents[2]
GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-00000000-0000-4000-8000-00000000000b"
EXTERNAL = "roughly 8,100 tok/s prefill"
SOURCE: dict[str, Any] = {
    "repository": "ormandj/sglang-glm53-flash-sm120",
    "release": "v0.1.1-rc.14",
    "commit": "a547c90c74f1363920287eb80adc88a16d1e7005",
    "external_prior": [
        {"figure": EXTERNAL, "conditions": "native Linux", "where": "upstream release report"}
    ],
}
GATES = ["smoke", "capacity", "endurance", "vram_reserve", "log_audit"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def qualification_bundle(root: Path, tx_id: str = "tx-report") -> Path:
    """Run the gates against a stub engine process; return the transaction's evidence directory."""
    port = _free_port()
    log = root / "stub.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anvil_stub",
                "--port",
                str(port),
                "--served-model",
                "glm53-393k",
                "--max-model-len",
                "32768",
                "--prefill-tps",
                "60000",
                "--decode-tps",
                "1000",
                "--verbose-default",
                "--answer-book",
                str(FIXTURES_DIR / "coding_answer_book.json"),
                "--log-line",
                "host:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal plugin.",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "stub did not become healthy"
            time.sleep(0.05)
        reads: list[int] = []

        def probe() -> list[tuple[str, int, int]]:
            reads.append(1)
            free = 3351 if len(reads) == 1 else 2101
            return [(GPU_A, free, 3072), (GPU_B, free, 3072)]

        def reader(max_lines: int, max_bytes: int) -> ContainerLog:
            bounded = ContainerLog.bounded(log.read_bytes(), max_lines=max_lines, max_bytes=max_bytes)
            return replace(bounded, status="running")

        profile = load_profile("demo").select(GATES)
        result = run_qualification(
            url,
            "glm53-393k",
            profile,
            evidence_dir=root / "evidence",
            tx_id=tx_id,
            identity_digest="a" * 64,
            reserve_probe=probe,
            container_log=reader,
            engine=STUB,
            provenance={"recipe": "stub-393k-c1", "engine": "stub", "source": SOURCE},
            recorded_identity={
                "slot": "primary",
                "served_model": "glm53-393k",
                "container_id": "c" * 64,
                "image_id": "sha256:" + "1" * 64,
                "binding": "127.0.0.1:8001",
                "context_tokens": 393216,
                "gpu_roles": ["compute-a", "compute-b"],
                "gpu_role_uuids": {"compute-a": GPU_A, "compute-b": GPU_B},
                "qualification_digest": "a" * 64,
            },
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return Path(result.tx_dir)
