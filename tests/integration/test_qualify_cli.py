"""`anvilctl qualify`, `evidence export|verify` and `audit decisions|evidence` as an operator
runs them: subprocesses of `python -m anvil_ctl` on the real Docker Engine of scripts/testenv,
stub candidates loaded from the shipped recipes, simulated GPUs (two 97,887 MiB cards).

The stub figures are the seeds': after the workload the 245,760-token/C1 profile keeps
3,487 MiB free per card (verified against the standing 3,072 MiB reserve), the
393,216-token/C1 profile 2,101 MiB (policy-infeasible until a waiver reclassifies it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.waiver import Waiver
from anvil_ctl.engine.reclassify import reclassify_decisions
from anvil_ctl.persistence import waiver_rows
from tests.integration.hosts import sim_host_toml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INCUMBENT = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-00000000-0000-4000-8000-00000000000b"
HOST = sim_host_toml(GPU_A, GPU_B)


class Host:
    """A tmp state dir and anvil.toml, and `anvilctl` run as a subprocess against them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        (root / "anvil.toml").write_text(HOST)
        keep = ("PATH", "HOME", "DOCKER_HOST", "LANG")
        self.env = {k: os.environ[k] for k in keep if k in os.environ} | {
            "ANVIL_CONFIG": str(root / "anvil.toml"),
            "ANVIL_STATE_DIR": str(self.state),
            "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
            "ANVIL_GPU": "simulated",
            "ANVIL_LOG_FORMAT": "json",
            "ANVIL_LOG_LEVEL": "warning",
        }

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "anvil_ctl", *args],
            check=False,
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json(self, *args: str) -> Any:
        r = self.run("--json", *args)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def app(self) -> App:
        settings = Settings(  # type: ignore[call-arg]
            state_dir=self.state,
            config=self.root / "anvil.toml",
            recipes_dir=REPO / "recipes",
            backend="real",
            gpu="simulated",
        )
        return App(settings=settings, env={})

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.state / "anvil.db") as db:
            return list(db.execute(query, params))


@pytest.fixture
def loaded(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[Any]:
    """Factory: a host whose incumbent is adopted and `recipe` loaded as the candidate."""

    def make(recipe: str) -> tuple[Host, str]:
        host = Host(tmp_path)
        assert host.run("init").returncode == 0
        inc = stub_container(
            served_model=INCUMBENT,
            port=8001,
            labels={"io.anvil.slot": "primary", "io.anvil.role": "incumbent"},
            extra_args=["--max-model-len", "524288"],
        )
        r = host.run("adopt", inc.id, "--slot", "primary", "--context-tokens", "524288")
        assert r.returncode == 0, r.stderr
        out = host.json("load", recipe, "--slot", "primary")
        assert out["state"] == "committed", out
        return host, out["results"]["start-candidate"]["container_id"]

    yield make
    for c in runtime.list(labels={"io.anvil.role": "candidate"}):
        runtime.remove(c.id, force=True)


def qualify(host: Host, *extra: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `anvilctl qualify --slot primary`; return it and its transaction ID."""
    r = host.run("qualify", "--slot", "primary", *extra, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    tx = host.json("audit", "transactions", "--kind", "qualify", "--limit", "1")[0]["tx_id"]
    return r, tx


def check_evidence_and_rows(host: Host, tx: str, outcome: str, free_mib: int) -> dict[str, Any]:
    """Files, manifest, DB rows, transaction states and the decision; returns the decision."""
    tx_dir = host.state / "evidence" / tx
    manifest = json.loads((tx_dir / "manifest.json").read_text())
    listed = {a["path"] for a in manifest["artifacts"]}
    assert {"summary.json", "decision.json", "00-served-identity.json"} <= listed
    assert all((tx_dir / p).is_file() for p in listed)
    assert manifest["outcome"] == outcome
    reserve = json.loads((tx_dir / "15-vram_reserve.json").read_text())
    assert [(c["uuid"], c["free_mib"], c["reserve_mib"]) for c in reserve["evidence"]["cards"]] == [
        (GPU_A, free_mib, 3072),
        (GPU_B, free_mib, 3072),
    ]

    gates = host.sql("select gate, passed, sha256 from evidence where tx_id = ?", tx)
    assert len(gates) == 17  # served identity + the 16 gates of seed-qualification (log audit last)
    for gate, _passed, sha in gates:
        path = next(p for p in listed if p.endswith(f"-{gate}.json"))
        assert next(a for a in manifest["artifacts"] if a["path"] == path)["sha256"] == sha
    states = [s["state"] for s in host.json("audit", "show", tx)["states"]]
    assert states == ["planned", "running", "committed"]

    decisions = [d for d in host.json("audit", "decisions") if d["tx_id"] == tx]
    assert [(d["outcome"], d["reclassifies"]) for d in decisions] == [(outcome, None)]
    decision: dict[str, Any] = decisions[0]
    cand = host.json("audit", "show", tx)["args"]["candidate"]
    assert decision["container_id"] == cand["container_id"]
    manifest_sha = hashlib.sha256((tx_dir / "manifest.json").read_bytes()).hexdigest()
    assert decision["manifest_sha256"] == manifest_sha
    return decision


def export_verify_and_tamper(host: Host, tx: str, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    r = host.run("evidence", "export", tx[:8], str(bundle))
    assert r.returncode == 0, r.stderr
    text = "".join(p.read_text() for p in bundle.iterdir())
    assert GPU_A not in text and GPU_B not in text and "GPU-REDACTED-1" in text
    assert str(host.state.resolve()) not in text and str(tmp_path) not in text
    ok = host.run("evidence", "verify", str(bundle))
    assert ok.returncode == 0 and ok.stdout.startswith("ok: "), ok.stdout + ok.stderr

    target = bundle / "15-vram_reserve.json"
    data = bytearray(target.read_bytes())
    data[40] ^= 0x01
    target.write_bytes(bytes(data))
    bad = host.run("evidence", "verify", str(bundle))
    assert bad.returncode == 6, bad.stdout + bad.stderr
    assert "MISMATCH" in bad.stdout and "15-vram_reserve.json: sha256" in bad.stdout
    assert host.json("audit", "evidence", tx)["verify"]["ok"] is True  # the source is untouched


class TestQualifyCli:
    def test_the_245k_candidate_is_verified_with_its_evidence_exported_and_verified(
        self, loaded: Any, tmp_path: Path
    ) -> None:
        host, container = loaded("stub-245k-c1")
        r, tx = qualify(host)
        print(r.stdout)
        for label in ("Nominal context", "4K ", "120K", "230K", "4K endurance"):
            assert label in r.stdout
        rows = [line.split()[0] for line in r.stdout.splitlines() if line[:1].isdigit()]
        assert rows == ["4K", "120K", "230K", "4K"]  # 380K exceeds max_model_len: skipped
        assert "380K/C1 skipped" in r.stdout
        assert "DECISION: VERIFIED" in r.stdout
        assert "[16/17] vram_reserve" in r.stderr  # plain progress lines off a TTY
        assert "[17/17] log_audit" in r.stderr
        decision = check_evidence_and_rows(host, tx, "verified", 3487)
        assert decision["container_id"] == container
        export_verify_and_tamper(host, tx, tmp_path)

    def test_the_393k_candidate_is_policy_infeasible_until_a_waiver_reclassifies_it(
        self, loaded: Any, tmp_path: Path
    ) -> None:
        host, _ = loaded("stub-393k-c1")
        r, tx = qualify(host)
        print(r.stdout)
        assert "DECISION: POLICY-INFEASIBLE" in r.stdout
        rows = [line.split()[0] for line in r.stdout.splitlines() if line[:1].isdigit()]
        assert rows == ["4K", "120K", "230K", "380K", "4K"]
        assert "below_reserve" in r.stdout
        raw = check_evidence_and_rows(host, tx, "policy-infeasible", 2101)
        export_verify_and_tamper(host, tx, tmp_path)

        app = host.app()
        now = datetime.now(UTC)
        waiver = Waiver(
            id="w-model-pair",
            policy="vram-reserve",
            value=0,
            approved_by="operator",
            reason="model-only GPU pair",
            created_at=now - timedelta(seconds=1),
            roles=frozenset({"compute-a", "compute-b"}),
            expires_at=now + timedelta(days=1),
        )
        waiver_rows.add_waiver(app.store, waiver)
        report = reclassify_decisions(app.world(), slot="primary")
        assert [(d["outcome"], d["reclassifies"], d["waiver_ids"]) for d in report.recorded] == [
            ("verified", raw["id"], ["w-model-pair"])
        ]
        assert reclassify_decisions(app.world()).recorded == []  # nothing new to say
        again = next(d for d in host.json("audit", "decisions") if d["id"] == raw["id"])
        assert again == raw  # the original decision is never rewritten
        manifest = host.state / "evidence" / tx / "manifest.json"
        assert host.run("evidence", "verify", str(manifest.parent)).returncode == 0

        # Qualifying under the active waiver records the raw decision and its reclassification.
        r2, tx2 = qualify(host, "--gates", "vram_reserve")
        assert "DECISION: POLICY-INFEASIBLE" in r2.stdout
        assert "RECLASSIFIED: VERIFIED under waiver(s) w-model-pair" in r2.stdout
        pair = [
            (d["outcome"], d["reclassifies"]) for d in host.json("audit", "decisions") if d["tx_id"] == tx2
        ]
        assert pair[0] == ("policy-infeasible", None) and pair[1][0] == "verified"


class TestQualifyRefusals:
    def test_a_slot_without_a_candidate_is_refused_and_recorded(
        self, tmp_path: Path, stub_container: Any
    ) -> None:
        host = Host(tmp_path)
        assert host.run("init").returncode == 0
        r = host.run("qualify", "--slot", "primary")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "no loaded candidate" in r.stdout
        rows = host.sql("select state from v_transactions where kind = 'qualify'")
        assert rows == [("refused",)]
        assert host.sql("select count(*) from decisions") == [(0,)]

    def test_a_candidate_that_no_longer_serves_is_refused(self, loaded: Any, runtime: Any) -> None:
        host, container = loaded("stub-245k-c1")
        runtime.stop(container, 5)
        r = host.run("qualify", "--slot", "primary")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "not running" in r.stdout
        assert host.sql("select count(*) from evidence") == [(0,)]
