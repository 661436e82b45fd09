"""`make demo-real`: the demo's story on a real engine nobody here wrote.

llama.cpp (llama-cpp-python 0.3.36, CPU) serving SmolLM2-135M-Instruct (GGUF Q4_1) in real
containers of the hermetic test environment, a real HAProxy in front (its checks GET the
engine profile's check path, /docs: llama.cpp has no /health and its /v1/models waits
behind a running completion). A 2,048-token incumbent started by hand serves
`llm.primary`; anvilctl adopts it (its context checked through the engine's refusal of an
over-long prompt), loads the 8,192-token candidate (incumbent stopped and retained),
qualifies it with `real-small` (the functional gates fail on a 135M model, the capacity
cells are measured in the engine's own tokens and cross-checked against llama.cpp's own
timing lines), an operator waives the failed gates (attributed, expiring, naming them),
promotes it, plain curl and the openai client reach it through the router, rollback
restores the exact incumbent container, recheck passes, and the evidence bundle is
exported. Slow on a loaded 2-core machine (llama.cpp prefill of 6k tokens takes minutes).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from anvil_ctl.core.engine_profile import LLAMA_CPP_PYTHON
from anvil_ctl.recipes.model import load_recipe, recipe_digest
from scripts import engine_timing
from scripts.llama_host import (
    ALIAS,
    CANDIDATE_RECIPE,
    LlamaHost,
    container_logs,
    container_status,
    requests_served,
    routed_curl,
    start_incumbent_by_hand,
    start_llama_host,
)
from scripts.routers import exit_on_sigterm


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(host: LlamaHost, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    r = host.anvilctl(*args, echo=True)
    if r.returncode not in ok:
        raise SystemExit(f"demo-real: `anvilctl {' '.join(args)}` exited {r.returncode}")
    return str(r.stdout)


def step_result(host: LlamaHost, tx_id: str, step: str) -> dict[str, Any]:
    steps = host.anvilctl_json("audit", "show", tx_id)["steps"]
    found: dict[str, Any] = next(e for e in steps if e["step"] == step and e["event"] == "result")["detail"]
    return found


def adopt_and_load(host: LlamaHost) -> str:
    inc = host.incumbent_id
    banner("adopt it: a context the engine does not serve is refused (seen in llama.cpp's 400)")
    adopt = ("adopt", inc, "--slot", "primary", "--engine", "llama-cpp-python", "--context-tokens")
    run(host, *adopt, "8192", ok=(2,))
    run(host, *adopt, "2048")
    run(host, "recheck", "--slot", "primary")
    banner("load the 8,192-token candidate (its model file verified byte for byte first)")
    run(host, "load", CANDIDATE_RECIPE, "--slot", "primary")
    print(f"incumbent {inc[:12]}: {container_status(inc)} (stopped, retained)")
    load_tx = host.anvilctl_json("audit", "transactions", "--kind", "load")[0]["tx_id"]
    awaited = step_result(host, load_tx, "await-candidate")
    print(
        f"first readiness poll: {awaited['first_poll']}; serving after {awaited['polls']} polls, "
        f"{awaited['waited_s']} s"
    )
    return str(step_result(host, load_tx, "start-candidate")["container_id"])


def qualify(host: LlamaHost) -> dict[str, Any]:
    banner("qualify it with real-small: real tokens, real failures")
    r = host.anvilctl("--json", "qualify", "--slot", "primary", "--profile", "real-small")
    out: dict[str, Any] = json.loads(r.stdout)
    for g in out["gates"]:
        verdict = "PASS" if g["passed"] else "FAIL"
        print(f"  {g['name']:<16} {verdict}  {g['classification']:<22} {g['summary'][:90]}")
    print(f"decision: {out['outcome']}")
    for reason in out["decision"]["reasons"]:
        print(f"  reason: {reason}")
    smoke = json.loads(next(Path(out["tx_dir"]).glob("*-smoke.json")).read_text())
    said = next(c for c in smoke["evidence"]["checks"] if c["check"] == "plain: content")
    print(f"asked for {said['expected']!r}; the model said: {said['observed'][:160]!r}")
    run(host, "audit", "evidence", out["tx_id"])
    return out


def cross_check(host: LlamaHost, out: dict[str, Any], candidate: str) -> None:
    banner("cross-check the capacity gate against llama_perf_context_print")
    capacity = next(Path(out["tx_dir"]).glob("*-capacity.json"))
    cells = [c for c in json.loads(capacity.read_text())["evidence"]["cells"] if not c.get("skipped")]
    assert LLAMA_CPP_PYTHON.timing is not None
    blocks = engine_timing.parse_blocks(container_logs(candidate, timestamps=True), LLAMA_CPP_PYTHON.timing)
    report = engine_timing.compare(cells, blocks)
    print("tokens/s, p50 of 3 requests per cell; gate: what the client measured; engine: its log lines")
    for c, cell in zip(engine_timing.report_cells(report), cells, strict=True):
        print(
            f"  nominal {c['nominal_tokens']}: {cell['prompt_tokens_p50']:.0f} prompt tokens (engine's count)"
        )
        print(
            f"    prefill: gate {c['gate_prefill_tps_p50']:.1f}; engine prompt eval "
            f"{c['engine_prompt_eval_tps_p50']:.1f} ({c['prefill_diff_vs_prompt_eval']:+.1%}), "
            f"engine (total - eval) {c['engine_prefill_tps_from_totals_p50']:.1f} "
            f"({c['prefill_diff_vs_totals']:+.1%}); implausible prompt-eval lines: "
            f"{c['implausible_prompt_eval']}"
        )
        print(
            f"    decode:  gate {c['gate_decode_tps_p50']:.1f}; engine eval {c['engine_eval_tps_p50']:.1f} "
            f"({c['decode_diff']:+.1%}), engine decode phase {c['engine_decode_phase_tps_p50']:.1f} "
            f"({c['decode_diff_vs_decode_phase']:+.1%}; {c['engine_decode_overhead_p50']:.1%} of it "
            f"not eval); within the engine's window +-{report['decode_tolerance']:.0%}: "
            f"{c['decode_within_engine']}"
        )
    (host.work / "cross-check.json").write_text(json.dumps(report, indent=2) + "\n")


def waive_and_promote(host: LlamaHost, out: dict[str, Any], candidate: str) -> None:
    banner(
        "the operator waives the failed gates for this recipe, until tomorrow; the decision is reclassified"
    )
    failed = sorted(g["name"] for g in out["gates"] if not g["passed"])
    digest = recipe_digest(load_recipe(REPO / "recipes" / f"{CANDIDATE_RECIPE}.toml"))
    expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).date().isoformat()
    reason = "135M model: instruction following is not required of it here"
    scope = ("--policy", "gate", "--scope", digest, "--gates", ",".join(failed))
    run(host, "waive", *scope, "--approved-by", "operator", "--reason", reason, "--expires", expires)
    run(host, "audit", "decisions")
    banner("promote with an approver: routed smoke and the openai client pass")
    run(host, "promote", "--slot", "primary", "--approved-by", "operator")
    before = requests_served(candidate)
    status, body = routed_curl(host, "Say hello.")
    print(f"curl through the router: HTTP {status}, model {body.get('model')!r}, usage {body.get('usage')}")
    client = openai.OpenAI(
        base_url=host.haproxy.url + "/v1", api_key=host.client_token, max_retries=0, timeout=300
    )
    try:
        reply = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16
        )
    finally:
        client.close()
    print(f"openai client through the router: {reply.choices[0].message.content!r} ({reply.usage})")
    served = requests_served(candidate) - before
    print(f"the candidate's access log shows {served} more chat completions")
    print(f"incumbent {host.incumbent_id[:12]}: {container_status(host.incumbent_id)}")
    run(host, "recheck", "--slot", "primary")


def roll_back_and_audit(host: LlamaHost, out: dict[str, Any], candidate: str) -> None:
    banner("roll back to the exact incumbent container")
    run(host, "rollback", "--slot", "primary")
    print(f"incumbent {host.incumbent_id[:12]}: {container_status(host.incumbent_id)}")
    print(f"candidate {candidate[:12]}: {container_status(candidate)}")
    run(host, "recheck", "--slot", "primary", "--textfile", str(host.work / "anvil.prom"))
    banner("audit and the evidence bundle")
    run(host, "audit", "transactions")
    export = host.work / "evidence-export"
    run(host, "evidence", "export", out["tx_id"], str(export))
    run(host, "evidence", "verify", str(export))
    run(host, "audit", "verify")
    print(f"\ndemo-real: done. State database: {host.work / 'state' / 'anvil.db'}; bundle: {export}")


def main() -> int:
    cache = os.environ.get("ANVIL_MODEL_CACHE")
    if not os.environ.get("ANVIL_LLAMA_IMAGE_ID") or not cache:
        raise SystemExit("demo-real: the llama engine image is not loaded (make llama; scripts/testenv)")
    exit_on_sigterm()
    work = REPO / "state" / "demo-real"
    banner(
        f"a real HAProxy on 127.0.0.1 (checks GET {LLAMA_CPP_PYTHON.check_path}); "
        "its client key in a 0600 file"
    )
    host = start_llama_host(work, Path(cache))
    print(f"haproxy pid {host.haproxy.pid} at {host.haproxy.url}; state in {work}")
    try:
        run(host, "init")
        banner("the incumbent: llama.cpp serving SmolLM2-135M at 2,048 tokens, started by hand, routed")
        start_incumbent_by_hand(host)
        status, body = routed_curl(host, "Say hello.")
        print(
            f"container {host.incumbent_id[:12]} serves {ALIAS} through the router: "
            f"curl HTTP {status}, model {body.get('model')!r} (llama.cpp echoes the request's model)"
        )
        candidate = adopt_and_load(host)
        out = qualify(host)
        cross_check(host, out, candidate)
        waive_and_promote(host, out, candidate)
        roll_back_and_audit(host, out, candidate)
    finally:
        host.stop()
        runtime = DockerRuntime(gpu_mode="simulated")
        for info in runtime.list(labels={"io.anvil.managed": "true"}):
            runtime.remove(info.id, force=True)
        runtime.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
