"""`make demo`: the seed campaign in small, inside the hermetic test environment.

A stub EXL3-like incumbent serves `llm.primary` through a real smg router on
127.0.0.1 (keys in a 0600 credential file). anvilctl adopts it, loads the 393K
stub candidate from its pinned recipe on the real Docker Engine (incumbent
stopped and retained), qualifies it (policy-infeasible: 2,101 MiB free per card
after the workload against the 3,072 MiB reserve), records an operator's waiver
(reclassified verified, raw evidence unchanged), promotes it with an approver
(routed smoke + the openai client), rechecks, rolls back to the exact incumbent
container, rechecks again and prints the audit trail. GPUs are simulated: there
is no GPU on this machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.campaign import Campaign, runtime, start_campaign, start_incumbent_by_hand


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(c: Campaign, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    r = c.anvilctl(*args, echo=True)
    if r.returncode not in ok:
        raise SystemExit(f"demo: `anvilctl {' '.join(args)}` exited {r.returncode}")
    return r.stdout


def main() -> int:
    work = REPO / "state" / "demo"
    banner("a real smg router on 127.0.0.1; router keys in a 0600 credential file")
    c = start_campaign(work)
    print(f"smg pid {c.smg.pid} at {c.smg.url}; state in {work}")
    try:
        run(c, "init")
        banner("the incumbent: a stub EXL3 K3 + DFlash2 K5 524K serve, started by hand and routed")
        start_incumbent_by_hand(c)
        print(f"container {c.incumbent_id[:12]} serves llm.primary through the router")
        run(c, "adopt", c.incumbent_id, "--slot", "primary", "--context-tokens", "524288")
        run(c, "recheck", "--slot", "primary")

        banner("load the 393,216-token C1 candidate (dry run, then for real)")
        run(c, "load", "stub-393k-c1", "--slot", "primary", "--dry-run")
        run(c, "load", "stub-393k-c1", "--slot", "primary")
        print(
            f"incumbent {c.incumbent_id[:12]}: {runtime().inspect(c.incumbent_id).status} (stopped, retained)"
        )
        run(c, "status")

        banner("qualify it: function passes; 2,101 MiB free per card < 3,072 -> policy-infeasible")
        run(c, "qualify", "--slot", "primary", "--profile", "demo")
        run(c, "audit", "decisions")

        banner("promotion is refused without a verified decision")
        run(c, "promote", "--slot", "primary", "--approved-by", "operator", ok=(3,))

        banner("the operator waives the reserve for the model-only GPU pair; the decision is reclassified")
        run(
            c,
            "waive",
            "--policy",
            "vram-reserve",
            "--scope",
            "compute-a,compute-b",
            "--value",
            "0",
            "--approved-by",
            "operator",
            "--reason",
            "model-only GPU pair",
        )
        run(c, "audit", "decisions")

        banner("promote with an approver: routed smoke and the openai client pass")
        run(c, "promote", "--slot", "primary", "--approved-by", "operator")
        run(c, "recheck", "--slot", "primary")

        banner("roll back to the exact incumbent container")
        run(c, "rollback", "--slot", "primary")
        print(f"incumbent {c.incumbent_id[:12]}: {runtime().inspect(c.incumbent_id).status}")
        run(c, "recheck", "--slot", "primary", "--textfile", str(work / "anvil.prom"))

        banner("audit")
        run(c, "audit", "transactions")
        txs = json.loads(c.anvilctl("--json", "audit", "transactions", "--kind", "rollback").stdout)
        run(c, "audit", "diff", txs[0]["tx_id"])
        run(c, "audit", "verify")
        print(f"\ndemo: done. State database: {work / 'state' / 'anvil.db'}")
    finally:
        c.stop()
        rt = runtime()
        for info in rt.list(labels={"io.anvil.managed": "true"}):
            rt.remove(info.id, force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
