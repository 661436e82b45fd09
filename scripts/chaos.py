"""Never dark, on real Docker and a real router: kill, restart and recover, then judge.

One campaign host (scripts/campaign.py: smg with keys or HAProxy, simulated GPUs, the stub
incumbent adopted) is driven around the lifecycle: A (incumbent serving, routed)
-load-> B (candidate serving directly, tier drained) -promote-> C (candidate
routed) -rollback-> A. Each case runs one command and disturbs it:

- `crash`: SIGKILL at a named journal boundary (ANVIL_CRASH_AT), then `recover` twice;
- `random`: SIGKILL after a random delay within the command's clean duration, then `recover`;
- `router`: pause at a boundary (ANVIL_PAUSE_AT), kill and restart smg, let it go on;
- `router-after-commit`: the same just after the transaction committed (its last step's
  result commits with the end state: engine/runner.py), which no transaction can
  undo; the operator's cron `recheck --repair router` is what must bring the route back.

A rollback from C goes back to the incumbent (A); from A it rolls back to the
retained candidate (`rollback --to`, C again), so rollback cases need no new load.

`load-promote` runs `load --promote` from A with a candidate whose identity was verified
before: two transactions in one process, killed at the boundaries of both. It ends in C, or
in A when it compensated whole or `recover` could not promote and brought the incumbent back;
B after `recover` (the candidate unrouted, the incumbent stopped) is dark for clients and
judged inconsistent. Two more faults strike the `recover` that finishes an interrupted chain
(`load --promote` killed at `load:state:committed`): `recover-crash`, the first `recover`
killed at each boundary of the promotion it runs, and `recover-crash-back`, with the
candidate's decision failed so that the promotion is refused, killed at each boundary of the
rollback that brings the incumbent back; the second and third `recover` are judged.

`promote-canary` (HAProxy, `CanaryHost`) runs `promote --canary` from a second slot of the
incumbent's tier (`primary-b`, a CPU stub candidate loaded there): A is the incumbent alone
serving the tier, C the canary's candidate alone serving it; a case starting from C goes back
by `rollback --slot primary-b` and loads a fresh candidate. Both slots must recheck clean in
A and C (one `serving`, the other `standby`).

Then the host is judged against the command's before and after states: `before`
or `after` when every container, the binding's model and the routed model are
exactly one of them; `dark` when the binding answers nothing, or a state that
must be routed is not; `inconsistent` otherwise. `recheck` must pass wherever
the incumbent serves, and `audit verify` always.

    scripts/testenv run -- .venv/bin/python scripts/chaos.py --seed 7 --random 30
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import contextlib

from anvil_ctl.bootstrap import App
from anvil_ctl.config.settings import Settings
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.queries import TransactionSummary
from scripts.campaign import (
    INCUMBENT_MODEL,
    Campaign,
    reserve_waiver,
    runtime,
    start_campaign,
    start_incumbent_by_hand,
    verified_decision,
)
from scripts.routers import exit_on_sigterm

ALIAS = "llm.primary"
BINDING = "http://127.0.0.1:8001"
LOAD_PROMOTE = "load-promote"
COMMANDS = ("load", "promote", "promote-watched", "rollback", LOAD_PROMOTE)
CANARY = "promote-canary"
CHAIN_CUT = "load:state:committed"
"""Where a `recover-crash` case kills `load --promote`: its chain interrupted, left to recover."""
RECOVER_KILLS = {"recover-crash": "promote", "recover-crash-back": "rollback"}
"""The faults that kill the first `recover` of an interrupted chain, and the kind of the
transaction of the chain's whose boundaries they strike."""
MODES = ("crash", "router", "random", *RECOVER_KILLS)
BEFORE = {
    "load": ("A",),
    LOAD_PROMOTE: ("A",),
    "promote": ("B",),
    "promote-watched": ("B",),
    "rollback": ("A", "C"),
    CANARY: ("A",),
}
WATCH = "4s"
"""`promote-watched` watches this long (the default [watch] thresholds): its kills strike the
watching phase too, which `recover` resumes."""
AFTER = {"A": "C", "C": "A"}  # a rollback's after phase, by its before phase


@dataclass(frozen=True)
class Case:
    command: str
    mode: str  # crash | random | router | router-after-commit | clean
    boundary: str = ""
    delay_s: float = 0.0

    @property
    def label(self) -> str:
        where = self.boundary or (f"{self.delay_s:.2f}s" if self.mode == "random" else "")
        return f"{self.command} {self.mode} {where}".strip()


@dataclass
class Verdict:
    case: Case
    tx_state: str
    converged: str  # before | after | dark | inconsistent
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.converged in ("before", "after") and not self.problems


@dataclass(frozen=True)
class Observed:
    running: frozenset[str]
    binding_model: str | None
    routed_model: str | None


class ChaosHost:
    """The campaign host and the lifecycle phase it is in."""

    def __init__(self, work: Path, router: str = "smg", *, incumbent_engine: str = "stub") -> None:
        """`incumbent_engine`: the engine profile the incumbent is adopted with; one without a
        running-requests gauge (`openai-compatible`) makes the router's count what a drain of
        the incumbent reads."""
        self.camp: Campaign = start_campaign(work, router)
        self.incumbent_engine = incumbent_engine
        try:
            self._start()
        except BaseException:
            self.camp.stop()  # no router left running (or to a ResourceWarning) by a failed start
            raise
        self.durations: dict[str, float] = {}

    def _start(self) -> None:
        r = self.camp.anvilctl("init")
        assert r.returncode == 0, r.stderr
        start_incumbent_by_hand(self.camp)
        r = self.camp.anvilctl(
            "adopt",
            self.camp.incumbent_id,
            "--slot",
            "primary",
            "--context-tokens",
            "524288",
            "--engine",
            self.incumbent_engine,
        )
        assert r.returncode == 0, r.stderr
        # The campaign's waiver (shared/seeds: "standing reserve 3,072 MiB/card, waived to 0 for
        # the pair"): without it promote's VRAM-after-acceptance step refuses every promotion.
        r = self.camp.anvilctl(*reserve_waiver("chaos", "model-only GPU pair (seed campaign)"))
        assert r.returncode == 0, r.stderr

    # -- observing ----------------------------------------------------------------------------

    @property
    def candidate(self) -> str | None:
        """The latest loaded candidate, from the record."""
        ident = self.app().store.current_identity("primary", "candidate")
        return ident.container_id if ident else None

    @property
    def promoted(self) -> bool:
        """The candidate was promoted once: a rollback can go either way between A and C."""
        from anvil_ctl.commands import audit

        cand = self.candidate
        rows = audit.identities(self.app(), slot="primary", role="incumbent")
        return cand is not None and any(r["container_id"] == cand for r in rows)

    def app(self) -> App:
        env = self.camp.env
        settings = Settings(  # type: ignore[call-arg]
            state_dir=Path(env["ANVIL_STATE_DIR"]),
            config=Path(env["ANVIL_CONFIG"]),
            recipes_dir=Path(env["ANVIL_RECIPES_DIR"]),
            gpu="simulated",
            _env_file=None,
        )
        return App(settings=settings, env=env)

    def observe(self) -> Observed:
        import httpx

        rt = runtime()
        try:
            running = frozenset(c.id for c in rt.list(labels={"io.anvil.slot": "primary"}) if c.running)
        finally:
            rt.close()
        binding = routed = None
        try:
            models = httpx.get(f"{BINDING}/v1/models", timeout=5).json()["data"]
            binding = models[0]["id"] if len(models) == 1 else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            binding = None
        try:
            answer = httpx.post(
                f"{self.camp.router.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {self.camp.client_token}"},
                json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                timeout=30,
            )
            routed = answer.json().get("model") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            routed = None
        return Observed(running, binding, routed)

    def expected(self, phase: str) -> Observed:
        inc_model = INCUMBENT_MODEL
        cand_model = "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp"
        if phase == "A":
            return Observed(frozenset({self.camp.incumbent_id}), inc_model, inc_model)
        assert self.candidate is not None
        routed = cand_model if phase == "C" else None
        return Observed(frozenset({self.candidate}), cand_model, routed)

    def phase_of(self, seen: Observed) -> str | None:
        for phase in ("A", "B", "C"):
            if phase != "A" and self.candidate is None:
                continue
            want = self.expected(phase)
            if seen == want:
                return phase
        return None

    # -- driving --------------------------------------------------------------------------------

    def run(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        r = self.camp.anvilctl("--json", *args, env=env)
        try:
            out: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
        except ValueError:
            out = {}
        out["_exit"] = r.returncode
        return out

    def argv(self, command: str, phase: str | None = None) -> list[str]:
        if command == "load":
            return ["load", "stub-393k-c1", "--slot", "primary"]
        if command == LOAD_PROMOTE:
            return [*self.argv("load"), "--promote", "chaos"]
        if command == "promote":
            return ["promote", "--slot", "primary", "--approved-by", "chaos"]
        if command == "promote-watched":
            return ["promote", "--slot", "primary", "--approved-by", "chaos", "--watch", WATCH]
        if phase == "A" and self.candidate:  # back to the retained, once-promoted candidate
            return ["rollback", "--slot", "primary", "--to", self.candidate]
        return ["rollback", "--slot", "primary"]

    def prepare(self, command: str) -> str:
        """Bring the host to a before phase of the command (clean commands, no faults)."""
        if command == LOAD_PROMOTE and self.candidate is None:
            self.prepare("promote")  # loaded once and verified: the decision binds its identity
        for attempt in range(8):
            phase = self.phase_of(self.observe())
            if phase in BEFORE[command] and (command != "rollback" or self.promoted):
                if command.startswith("promote") or command == LOAD_PROMOTE:
                    self.verify_candidate()
                if command == LOAD_PROMOTE:
                    self.unload_stopped_candidates()
                return phase
            if attempt % 2:  # a clean command did not get there: a route an earlier case lost?
                self.run("recheck", "--slot", "primary", "--repair", "router")
                continue
            step = {"A": "load", "B": "promote", "C": "rollback", None: "recover"}[phase]
            if step == "promote":
                self.verify_candidate()
            if step == "load":
                self.unload_stopped_candidates()
            self.run(*self.argv(step, phase)) if step != "recover" else self.run("recover")
        raise RuntimeError(f"cannot reach phase {BEFORE[command]} for {command}: {self.observe()}")

    def verify_candidate(self, *, again: bool = False) -> None:
        """A verified decision for the loaded candidate (promote's precondition; qualify is not
        what this harness tests); `again`: a new one, newer than a failed one a case recorded."""
        app = self.app()
        suffix = f"-{time.monotonic_ns()}" if again else ""
        verified_decision(app.store, "primary", "chaos-{digest}" + suffix)

    def unload_stopped_candidates(self) -> None:
        rt = runtime()
        try:
            stopped = [c.id for c in rt.list(labels={"io.anvil.role": "candidate"}) if not c.running]
        finally:
            rt.close()
        for cid in stopped:
            if cid != self.candidate:
                self.run("unload", cid, "--yes")

    # -- one case -------------------------------------------------------------------------------

    def case(self, case: Case) -> Verdict:
        before = self.prepare(case.command)
        # Transactions that exist already: a kill before the command journals anything (during
        # start-up) leaves no transaction of its own, and an earlier one must not be judged.
        known = {t["tx_id"] for t in recent_transactions(self.app(), limit=10)}  # as many as judged
        after = (
            AFTER[before] if case.command == "rollback" else {"load": "B"}.get(case.command, "C")
        )  # load-promote: C
        argv = self.argv(case.command, before)
        env = dict(self.camp.env)
        state_dir = Path(env["ANVIL_STATE_DIR"])
        pause = state_dir / "paused-at"
        start = time.monotonic()
        if case.mode == "crash":
            out = self.run(*argv, env=env | {"ANVIL_CRASH_AT": case.boundary})
        elif case.mode == "random":
            proc = subprocess.Popen(
                [sys.executable, "-m", "anvil_ctl", "--json", *argv],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                proc.wait(timeout=case.delay_s)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            out = {}
        elif case.mode in RECOVER_KILLS:
            out = self.interrupt_chain(case.mode)
            self.run("recover", env=env | {"ANVIL_CRASH_AT": case.boundary})  # killed there
        elif case.mode in ("router", "router-after-commit"):
            proc = subprocess.Popen(
                [sys.executable, "-m", "anvil_ctl", "--json", *argv],
                env=env | {"ANVIL_PAUSE_AT": case.boundary},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            deadline = time.monotonic() + 300
            while not pause.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            self.restart_router()
            pause.unlink(missing_ok=True)
            stdout, _ = proc.communicate(timeout=600)
            out = json.loads(stdout) if stdout.strip() else {}
        else:
            out = self.run(*argv)
            self.durations[case.command] = time.monotonic() - start
        recovered = [self.run("recover"), self.run("recover")]
        if case.mode == "router-after-commit":
            self.run("recheck", "--slot", "primary", "--repair", "router")  # the operator's cron
        verdict = self.judge(case, out, recovered, before, after, known)
        if case.mode == "recover-crash-back":
            self.verify_candidate(again=True)  # the failed decision stands no longer
        return verdict

    def interrupt_chain(self, mode: str) -> dict[str, Any]:
        """`load --promote` killed between its load's commit and its promotion (phase B, dark
        until `recover` finishes the chain); for `recover-crash-back` the candidate's decision
        is then failed, so that recover's promotion is refused and the incumbent brought back."""
        out = self.run(*self.argv(LOAD_PROMOTE), env=self.camp.env | {"ANVIL_CRASH_AT": CHAIN_CUT})
        if mode == "recover-crash-back":
            app = self.app()
            cand = app.store.current_identity("primary", "candidate")
            assert cand is not None, "the interrupted load recorded no candidate"
            qualification.record_decision(
                app.store,
                decision_id=f"chaos-failed-{time.monotonic_ns()}",
                tx_id=None,
                slot="primary",
                identity_digest=cand.qualification_digest,
                container_id=cand.container_id,
                outcome="failed",
                profile="",
                waiver_ids=(),
            )
        return out

    def recover_boundaries(self, mode: str) -> list[str]:
        """Every boundary of the transaction a `recover` runs for an interrupted chain in
        `mode` (its promotion, or its bring-back): finishes one chain cleanly to list them."""
        self.prepare(LOAD_PROMOTE)
        self.interrupt_chain(mode)
        kind = RECOVER_KILLS[mode]
        out = self.run("recover")
        if mode == "recover-crash-back":
            self.verify_candidate(again=True)
        txs = [str(r["tx_id"]) for r in out.get("recovered", []) if r.get("kind") == kind and r.get("tx_id")]
        rows = []
        for tx in txs[-1:]:
            shown = self.run("audit", "show", tx)
            rows += [f"{kind}:state:{s['state']}" for s in shown["states"]]
            rows += [f"{kind}:{e['step']}:{e['phase']}:{e['event']}" for e in shown["steps"]]
        return list(dict.fromkeys(rows))

    def restart_router(self) -> None:
        """The router killed (SIGKILL) and started again with the same arguments: every
        registration lost."""
        self.camp.restart_router()

    def judge(
        self,
        case: Case,
        out: dict[str, Any],
        recovered: list[dict[str, Any]],
        before: str,
        after: str,
        known: set[str],
    ) -> Verdict:
        app = self.app()
        kind = "canary" if case.command == CANARY else case.command.split("-")[0]  # a watched promote
        txs = [t for t in recent_transactions(app) if t["kind"] == kind and t["tx_id"] not in known]
        tx_state = txs[0]["state"] if txs else "none"  # none: killed before it journaled anything
        want = {"before": ("compensated", "refused", "none"), "after": ("committed",)}
        if case.command == LOAD_PROMOTE:
            # The newest of the chain's transactions (load, its promotions, recover's rollback)
            # names how it ended: A by the load undone or by the incumbent brought back.
            chain = [
                t
                for t in recent_transactions(app, limit=10)
                if t["kind"] in ("load", "promote", "rollback") and t["tx_id"] not in known
            ]
            tx_state = f"{chain[0]['kind']}:{chain[0]['state']}" if chain else "none"
            want = {
                "before": ("load:compensated", "load:refused", "rollback:committed", "none"),
                "after": ("promote:committed",),
            }
        problems = []
        if recovered[-1].get("recovered"):
            problems.append(f"second recover still found work: {recovered[-1]['recovered']}")
        if any(r["_exit"] != 0 for r in recovered):
            problems.append(f"recover exit {[r['_exit'] for r in recovered]}")
        seen = self.observe()
        phase = self.phase_of(seen)
        if phase == before:
            converged = "before"
        elif phase == after:
            converged = "after"
        elif seen.binding_model is None or (phase is None and seen.routed_model is None):
            converged = "dark"
        else:
            converged = "inconsistent"
        wanted = want.get(converged, ())
        if wanted and tx_state not in wanted:
            problems.append(f"host is {converged} but the transaction is {tx_state}")
        if phase in ("A", "C"):
            for slot in self.slots:
                check = self.run("recheck", "--slot", slot)
                if check["_exit"] != 0:
                    problems.append(f"recheck --slot {slot} failed: {check.get('failed')}")
        verify = self.run("audit", "verify")
        if verify["_exit"] != 0:
            problems.append(f"audit verify: {verify}")
        detail = {"seen": [sorted(x[:12] for x in seen.running), seen.binding_model, seen.routed_model]}
        if converged not in ("before", "after"):
            problems.append(json.dumps(detail))
        return Verdict(case, tx_state, converged, problems)

    def boundaries(self, command: str) -> list[str]:
        """Every boundary a clean run of `command` journals (runs it once)."""
        phase = self.prepare(command)
        start = time.monotonic()
        out = self.run(*self.argv(command, phase))
        self.durations[command] = time.monotonic() - start
        rows = []
        # `load --promote`: the load's boundaries, then its promotion's (`then`)
        for tx in (out, out.get("then") or {}):
            if not tx.get("tx_id"):
                continue
            shown = self.run("audit", "show", tx["tx_id"])
            kind = shown["kind"]  # a boundary is named by the transaction's kind
            rows += [f"{kind}:state:{s['state']}" for s in shown["states"]]
            rows += [f"{kind}:{e['step']}:{e['phase']}:{e['event']}" for e in shown["steps"]]
        return list(dict.fromkeys(rows))

    slots = ("primary",)

    def stop(self) -> None:
        self.camp.stop()


SECOND_SLOT = """
[slots.primary-b]
binding = "127.0.0.1:8002"
router_tier = "primary-local"
aliases = ["llm.primary"]
"""
CANARY_MODEL = "stub-canary"
CANARY_PROFILE = """
name = "canary-watch"
[[gates]]
type = "smoke"
[watch]
interval_s = 0.2
requests = 2
max_tokens = 8
consecutive = 1
[[watch.thresholds]]
metric = "error_rate"
max = 0
[[watch.thresholds]]
metric = "finish_reason_missing"
max = 0
[[watch.thresholds]]
metric = "ttft_p95_s"
max_ratio = 20
"""
"""The canary's step watch: one round per step, any failed answer a breach."""


def canary_recipe(recipes: Path, extra_args: tuple[str, ...] = ()) -> None:
    """`canary-b`: the A/B arm's CPU stub serving `stub-canary` at slot primary-b's binding."""
    src = (REPO / "recipes" / "stub-131k-mtp.toml").read_text()
    src = src.replace('name = "stub-131k-mtp"', 'name = "canary-b"')
    src = src.replace("glm53-flash-ormandj-sglang-sm120-tp2-131k-c1-adaptive-mtp", CANARY_MODEL)
    src = src.replace("port = 8012", "port = 8002").replace('"--port", "8012"', '"--port", "8002"')
    src = src.replace('"../anvil_', f'"{REPO}/anvil_')
    quoted = "".join(f' "{a}",' for a in extra_args)
    src = src.replace('  "--verbose-default",\n]', f'  "--verbose-default",{quoted}\n]')
    (recipes / "canary-b.toml").write_text(src)


def canary_pair(camp: Campaign, work: Path, extra_args: tuple[str, ...] = ()) -> tuple[dict[str, str], Path]:
    """Slot primary-b beside primary in its tier, the `canary-b` recipe and the step-watch
    profile: the environment that loads it and the profile's path."""
    config = Path(camp.env["ANVIL_CONFIG"])
    config.write_text(config.read_text() + SECOND_SLOT)
    recipes = work / "canary-recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    canary_recipe(recipes, extra_args)
    profile = work / "canary-watch.toml"
    profile.write_text(CANARY_PROFILE)
    return {**camp.env, "ANVIL_RECIPES_DIR": str(recipes)}, profile


class CanaryHost(ChaosHost):
    """The campaign host on HAProxy with slot primary-b beside primary, for `promote --canary`:
    A is the incumbent alone answering the tier, C the canary's candidate alone."""

    slots = ("primary", "primary-b")

    def __init__(self, work: Path) -> None:
        super().__init__(work, "haproxy")
        self.camp.env, self.profile = canary_pair(self.camp, work)

    @property
    def candidate(self) -> str | None:
        ident = self.app().store.current_identity("primary-b", "candidate")
        return ident.container_id if ident else None

    def observe(self) -> Observed:
        """Running: the pair's containers; binding: the model the first answering slot binding
        serves (None: neither answers); routed: every model four routed chats answered, sorted
        (None when one of them failed)."""
        import httpx

        rt = runtime()
        try:
            running = frozenset(
                c.id for slot in self.slots for c in rt.list(labels={"io.anvil.slot": slot}) if c.running
            )
        finally:
            rt.close()
        binding = None
        for url in (BINDING, "http://127.0.0.1:8002"):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                binding = binding or httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
        routed: set[str | None] = set()
        for _ in range(4):
            try:
                answer = httpx.post(
                    f"{self.camp.router.url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {self.camp.client_token}"},
                    json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                    timeout=30,
                )
                routed.add(answer.json().get("model") if answer.status_code == 200 else None)
            except (httpx.HTTPError, ValueError):
                routed.add(None)
        shown = None if None in routed else ",".join(sorted(m for m in routed if m))
        return Observed(running, binding, shown)

    def phase_of(self, seen: Observed) -> str | None:
        inc = self.camp.incumbent_id
        if inc in seen.running and seen.routed_model == INCUMBENT_MODEL:
            return "A"  # the candidate running or stopped: a compensated canary stops it
        cand = self.candidate
        if cand in seen.running and inc not in seen.running and seen.routed_model == CANARY_MODEL:
            return "C"
        return None

    def argv(self, command: str, phase: str | None = None) -> list[str]:
        shares = ["--canary", "10,50,100", "--step-watch", "10ms", "--profile", str(self.profile)]
        return ["promote", "--slot", "primary-b", *shares, "--approved-by", "chaos"]

    def prepare(self, command: str) -> str:
        """Phase A with a fresh, verified candidate running in primary-b."""
        for _ in range(8):
            phase = self.phase_of(self.observe())
            cand = self.candidate
            if phase == "A" and cand is not None and cand in self.observe().running:
                verified_decision(self.app().store, "primary-b", "chaos-canary-{digest}")
                return phase
            if phase == "C":
                self.run("rollback", "--slot", "primary-b")  # the canary's way back, by its slot
            elif phase == "A":
                self.run("load", "canary-b", "--slot", "primary-b")
            else:
                self.run("recover")
        raise RuntimeError(f"cannot reach phase A with a candidate for {command}: {self.observe()}")


def recent_transactions(app: App, limit: int = 5) -> list[TransactionSummary]:
    from anvil_ctl.commands import audit

    return audit.transactions(app, limit=limit)


def table(verdicts: list[Verdict]) -> str:
    rows: dict[tuple[str, str], Counter[str]] = {}
    for v in verdicts:
        key = (v.case.command, v.case.mode)
        rows.setdefault(key, Counter())[v.converged] += 1
        rows[key]["kills"] += 1
        if v.problems and v.converged in ("before", "after"):
            rows[key]["inconsistent"] += 1
    lines = [
        "| command | fault | kill points | before | after | dark | inconsistent |",
        "|---|---|---|---|---|---|---|",
    ]
    for (command, mode), c in sorted(rows.items()):
        lines.append(
            f"| {command} | {mode} | {c['kills']} | {c['before']} | {c['after']} | {c['dark']} "
            f"| {c['inconsistent']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--random", type=int, default=30, help="random-time kills per command")
    parser.add_argument("--work", type=Path, default=Path("/tmp/anvil-chaos"))
    parser.add_argument("--commands", default=",".join(COMMANDS), help=f"also: {CANARY} (alone)")
    parser.add_argument("--router", choices=("smg", "haproxy"), default="smg")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"the faults to run, of {','.join(MODES)} (the recover kills: {LOAD_PROMOTE} only)",
    )
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {','.join(unknown)}; expected some of {','.join(MODES)}")
    rng = random.Random(args.seed)
    exit_on_sigterm()
    if args.commands == CANARY:
        host: ChaosHost = CanaryHost(args.work)
    else:
        host = ChaosHost(args.work, args.router)
    verdicts: list[Verdict] = []
    try:
        commands = args.commands.split(",")
        for command in commands if "crash" in modes else ():
            for boundary in host.boundaries(command):
                verdicts.append(host.case(Case(command, "crash", boundary)))
                print(_line(verdicts[-1]), flush=True)
        for mode in RECOVER_KILLS if LOAD_PROMOTE in commands else ():
            for boundary in host.recover_boundaries(mode) if mode in modes else ():
                verdicts.append(host.case(Case(LOAD_PROMOTE, mode, boundary)))
                print(_line(verdicts[-1]), flush=True)
        for command in ("promote", "rollback") if "router" in modes else ():
            if command in commands:
                cases = [Case(command, "router", b) for b in during_transaction(host.boundaries(command))]
                cases.append(Case(command, "router-after-commit", f"{command}:state:committed"))
                for case in cases:
                    verdicts.append(host.case(case))
                    print(_line(verdicts[-1]), flush=True)
        for command in commands if "random" in modes else ():
            span = host.durations.get(command, 10.0)
            for _ in range(args.random):
                verdicts.append(host.case(Case(command, "random", delay_s=rng.uniform(0, span))))
                print(_line(verdicts[-1]), flush=True)
    finally:
        host.stop()
    print()
    print(table(verdicts))
    bad = [v for v in verdicts if not v.ok]
    print(f"\n{len(verdicts)} cases, seed {args.seed}: {len(bad)} not converged")
    return 1 if bad else 0


def during_transaction(boundaries: list[str]) -> list[str]:
    """The step boundaries a router restart can strike while the transaction is still open.

    A step's result is held and commits with the next journal write (engine/runner.py),
    so the last step's result commits with the end state: a pause there is after the commit,
    the `router-after-commit` case.
    """
    steps = [b for b in boundaries if ":do:" in b]
    results = [b for b in steps if b.endswith(":do:result")]
    return [b for b in steps if not results or b != results[-1]]


def _line(v: Verdict) -> str:
    mark = "ok " if v.ok else "BAD"
    return f"{mark} {v.case.label}: {v.tx_state} -> {v.converged} {'; '.join(v.problems)}"


if __name__ == "__main__":
    raise SystemExit(main())
