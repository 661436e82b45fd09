"""`make demo`: the seed campaign in small, inside the hermetic test environment.

A stub EXL3-like incumbent serves `llm.primary` through a real smg router on
127.0.0.1 (keys in a 0600 credential file). anvilctl adopts it; runs the matched
A/B control of two 131K stub arms (no speculation vs adaptive MTP) with its
boundary declared before the run; loads the 393K stub candidate from its pinned
recipe on the real Docker Engine (incumbent stopped and retained), qualifies it
(policy-infeasible: 2,101 MiB free per card after the workload against the 3,072
MiB reserve; the bounded final log audit passes), records an operator's waiver
(reclassified verified, raw evidence unchanged), promotes it with an approver
(routed smoke + the openai client + free VRAM after that acceptance), publishes
two claims from the exported evidence and recounts them, writes the one-page
report (and its screenshot, with headless Chromium when installed), rechecks,
rolls back to the exact incumbent container, rechecks again and prints the audit
trail. GPUs are simulated: there is no GPU on this machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.campaign import (
    Campaign,
    publish_claims,
    reserve_waiver,
    runtime,
    start_campaign,
    start_incumbent_by_hand,
    ticking,
)
from scripts.routers import exit_on_sigterm


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(c: Campaign, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    r = c.anvilctl(*args, echo=True)
    if r.returncode not in ok:
        raise SystemExit(f"demo: `anvilctl {' '.join(args)}` exited {r.returncode}")
    return r.stdout


def screenshot(page: Path, png: Path) -> None:
    """The report in headless Chromium (Debian's chromium), when installed."""
    browser = shutil.which("chromium")
    if browser is None:
        print("no chromium here: skipping the screenshot (make debs installs it)")
        return
    profile = png.parent / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1200,4400",
            f"--screenshot={png}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    shutil.rmtree(profile, ignore_errors=True)
    print(f"screenshot {png}")


def main() -> int:
    exit_on_sigterm()
    work = REPO / "state" / "demo"
    banner("a real smg router on 127.0.0.1; router keys in a 0600 credential file")
    c = start_campaign(work)
    print(f"smg pid {c.router.pid} at {c.router.url}; state in {work}")
    try:
        run(c, "init")
        banner("the incumbent: a stub EXL3 K3 + DFlash2 K5 524K serve, started by hand and routed")
        start_incumbent_by_hand(c)
        print(f"container {c.incumbent_id[:12]} serves llm.primary through the router")
        run(c, "adopt", c.incumbent_id, "--slot", "primary", "--context-tokens", "524288")
        run(c, "recheck", "--slot", "primary")

        banner("matched A/B control: 131K arms without and with adaptive MTP, boundary declared first")
        arms = []
        for recipe, slot in (("stub-131k-nospec", "ab-nospec"), ("stub-131k-mtp", "ab-mtp")):
            with ticking(f"demo: loading A/B arm {recipe} on slot {slot}"):
                out = json.loads(c.anvilctl("--json", "load", recipe, "--slot", slot).stdout)
            print(f"loaded {recipe} on slot {slot}: {out['state']}")
            arms.append(out["results"]["start-candidate"]["container_id"])
        run(
            c,
            "qualify",
            "--ab",
            "stub-131k-nospec",
            "stub-131k-mtp",
            "--slot",
            "ab-mtp",
            "--profile",
            "ab-stub",
        )
        for container in arms:
            run(c, "unload", container, "--yes")

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
        run(c, *reserve_waiver("operator"))
        run(c, "audit", "decisions")

        banner("promote with an approver: routed smoke, the openai client, free VRAM after acceptance")
        run(c, "promote", "--slot", "primary", "--approved-by", "operator")
        with ticking("demo: reading the promotion's VRAM reading from its record"):
            promote_tx = json.loads(
                c.anvilctl("--json", "audit", "transactions", "--kind", "promote").stdout
            )[0]
            shown = json.loads(c.anvilctl("--json", "audit", "show", promote_tx["tx_id"]).stdout)
        reading = next(
            e["detail"]
            for e in shown["steps"]
            if e["step"] == "vram-after-acceptance" and e["event"] == "result"
        )
        for card in reading["cards"]:
            print(
                f"after acceptance: {card['role']} {card['free_mib']:,} MiB free, reserve in force "
                f"{card['threshold_mib']:,} MiB (standing {reading['standing_mib'][card['role']]:,}; "
                f"waivers {', '.join(reading['waivers'])})"
            )
        run(c, "recheck", "--slot", "primary")

        banner("publish two claims from the exported evidence and recount them before posting")
        qualify_tx = json.loads(c.anvilctl("--json", "audit", "transactions", "--kind", "qualify").stdout)
        q393 = next(t["tx_id"] for t in qualify_tx if t["slot"] == "primary")
        bundle = work / "bundle-393k"
        run(c, "evidence", "export", q393, str(bundle))
        claims = publish_claims(bundle, work / "claims.toml")
        run(c, "claims", "render", str(claims))
        run(c, "claims", "check", str(claims), "--evidence", str(bundle))

        banner("the one-page report a person reads before promoting")
        page = work / "report.html"
        with ticking("demo: verifying the bundles and drawing the report's plots"):
            run(c, "evidence", "report", q393, "-o", str(page))
        screenshot(page, work / "report.png")

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
        with ticking("demo: stopping the router and removing the demo's containers"):
            c.stop()
            rt = runtime()
            for info in rt.list(labels={"io.anvil.managed": "true"}):
                rt.remove(info.id, force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
