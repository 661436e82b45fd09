"""`promote --canary` on real Docker with a real HAProxy, two stubs and the official client.

The campaign host's incumbent serves `llm.primary` from slot `primary` (127.0.0.1:8001); a
second slot of the same tier, `primary-b` (127.0.0.1:8002), holds the loaded, verified
candidate: a CPU stub, so the two fit together. While the canary runs, a client of the router
sends a chat every 0.3 s. A healthy canary steps 10, 50, 100 % and ends as a promote does
(real-client acceptance, VRAM after it, the record); then `recheck` of the serving slot says
`serving` and of the other `standby`, both exit 0, and a rollback by either slot's name
brings the old incumbent back. A candidate whose stub
answers 500 from its fourth completion on breaches at 50 % (one round per step, a breach is
one failing round), and every request returns to the incumbent: the only failed answers the
client saw are the candidate's injected faults. A process killed in the middle of a step
leaves the weights as they were; `recover` compensates: every request to the incumbent, the
candidate stopped. On smg, which cannot weigh, and for two serves that do not fit the cards
together, the canary is refused before anything changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from anvil_ctl.adapters.docker_runtime import DockerRuntime
from scripts.campaign import REPO, verified_decision
from scripts.chaos import ALIAS, CANARY_MODEL, ChaosHost, canary_pair
from tests.integration.conftest import campaign_host

pytestmark = pytest.mark.integration

CANDIDATE = CANARY_MODEL
CANDIDATE_URL = "http://127.0.0.1:8002"
INCUMBENT_URL = "http://127.0.0.1:8001"


def gpu_candidate_recipe(recipes: Path) -> None:
    """stub-393k-c1 (94,536 MiB per card on compute-a and compute-b) at slot primary-b's binding."""
    src = (REPO / "recipes" / "stub-393k-c1.toml").read_text()
    src = src.replace('name = "stub-393k-c1"', 'name = "canary-gpu"')
    src = src.replace("port = 8001", "port = 8002").replace('"--port", "8001"', '"--port", "8002"')
    src = src.replace('"../anvil_', f'"{REPO}/anvil_')
    (recipes / "canary-gpu.toml").write_text(src)


@dataclass
class Pair:
    host: ChaosHost
    env: dict[str, str]
    profile: Path

    def run(self, *args: str) -> dict[str, Any]:
        return self.host.run(*args, env=self.env)

    def canary(self, step_watch: str) -> dict[str, Any]:
        return self.run(
            "promote",
            "--slot",
            "primary-b",
            "--canary",
            "10,50,100",
            "--step-watch",
            step_watch,
            "--profile",
            str(self.profile),
            "--approved-by",
            "ops",
        )


@pytest.fixture
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pair]:
    """`request.param`: (router kind, the candidate stub's extra arguments)."""
    router, extra = request.param
    with campaign_host(tmp_path / "host", router) as host:
        p = Pair(host, *canary_pair(host.camp, tmp_path, extra))
        out = p.run("load", "canary-b", "--slot", "primary-b")
        assert out["_exit"] == 0, out
        verified_decision(host.app().store, "primary-b", "canary-{digest}")
        yield p


@dataclass
class Client:
    """The official client through the router, one chat every 0.3 s, each answer recorded."""

    url: str
    token: str
    answers: list[tuple[float, str | None, str | None]] = field(default_factory=list)
    """(when, the answering model, the error)."""
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        with openai.OpenAI(base_url=self.url + "/v1", api_key=self.token, max_retries=0, timeout=30) as c:
            while not self.stop.is_set():
                try:
                    r = c.chat.completions.create(
                        model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                    self.answers.append((time.monotonic(), r.model, None))
                except openai.APIError as exc:
                    self.answers.append((time.monotonic(), None, str(exc)))
                self.stop.wait(0.3)

    def finish(self) -> list[tuple[float, str | None, str | None]]:
        self.stop.set()
        self.thread.join(timeout=60)
        return list(self.answers)


def client_of(p: Pair) -> Client:
    return Client(p.host.camp.router.url, p.host.camp.client_token)


def running(container_id: str) -> bool:
    rt = DockerRuntime(gpu_mode="simulated")
    try:
        return rt.inspect(container_id).running
    finally:
        rt.close()


def weights(p: Pair) -> dict[str, tuple[str, int]]:
    """url -> (status, weight) of the tier's live servers, as HAProxy reports them."""
    with p.host.camp.router_client() as router:
        stat = router.command("show stat")
    header = stat.splitlines()[0][2:].split(",")
    out = {}
    for line in stat.splitlines()[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        ours = row.get("pxname") == "tier_primary-local" and row.get("svname", "").startswith("s")
        if ours and not row.get("status", "").startswith("MAINT"):
            out["http://" + row["addr"]] = (row["status"], int(row["weight"]))
    return out


def phases(p: Pair) -> dict[str, tuple[str, int, list[str]]]:
    """slot -> (phase, exit code, failed assertions) of `recheck --slot` for both slots."""
    out = {}
    for slot in ("primary", "primary-b"):
        r = p.run("recheck", "--slot", slot)
        out[slot] = (r["phase"], r["_exit"], r["failed"])
    return out


@pytest.mark.parametrize("pair", [("haproxy", ())], indirect=True)
@pytest.mark.parametrize("back_by", ["primary", "primary-b"])
def test_a_healthy_canary_steps_to_100_and_commits_as_a_promote_does(pair: Pair, back_by: str) -> None:
    """...then each slot rechecks clean (the serving one `serving`, the other `standby`), and a
    rollback by either slot's name brings the old incumbent back."""
    app = pair.host.app()
    incumbent = app.store.current_identity("primary", "incumbent")
    candidate = app.store.current_identity("primary-b", "candidate")
    assert incumbent is not None and candidate is not None
    client = client_of(pair)
    out = pair.canary("1s")
    answers = client.finish()

    assert (out["_exit"], out["state"]) == (0, "committed"), out
    shares = [out["results"][f"share-{s}"] for s in (10, 50, 100)]
    assert [s["weights"] for s in shares] == [
        {INCUMBENT_URL: 100 - s, CANDIDATE_URL: s} for s in (10, 50, 100)
    ]
    assert all(s["verdict"] == "healthy" and s["rounds"] for s in shares)
    first = shares[0]["rounds"][0]
    assert first["incumbent"]["requests"] and first["candidate"]["requests"]  # side by side
    # A promote's own last steps: the official client through the route, VRAM after it.
    accepted = out["results"]["acceptance"]
    assert accepted["passed"] is True, accepted
    assert out["results"]["vram-after-acceptance"]["passed"] is True
    assert out["results"]["record-promotion"]["vram_after_acceptance"]["passed"] is True
    assert [a for a in answers if a[2]] == []  # no failed answer
    assert {a[1] for a in answers} >= {CANDIDATE}
    assert answers[-1][1] == CANDIDATE

    assert weights(pair) == {CANDIDATE_URL: ("UP", 1)}  # readmitted alone: the config's weight
    store = pair.host.app().store
    now = store.current_identity("primary-b", "incumbent")
    rollback = store.current_identity("primary", "rollback")
    assert now is not None and now.container_id == candidate.container_id
    assert rollback is not None and rollback.container_id == incumbent.container_id
    assert not running(incumbent.container_id) and running(candidate.container_id)
    assert phases(pair) == {"primary-b": ("serving", 0, []), "primary": ("standby", 0, [])}

    # The way back, by either name: the candidate drained, stopped and retained.
    back = pair.run("rollback", "--slot", back_by)
    assert (back["_exit"], back["state"]) == (0, "committed"), back
    assert back["results"]["stop-current"]["container_id"] == candidate.container_id
    assert weights(pair) == {INCUMBENT_URL: ("UP", 1)}
    assert running(incumbent.container_id) and not running(candidate.container_id)
    assert phases(pair) == {"primary": ("serving", 0, []), "primary-b": ("standby", 0, [])}


@pytest.mark.parametrize("pair", [("haproxy", ("--late-fault", "http-500@3"))], indirect=True)
def test_a_fault_at_the_second_step_returns_every_request_to_the_incumbent(pair: Pair) -> None:
    app = pair.host.app()
    candidate = app.store.current_identity("primary-b", "candidate")
    incumbent = app.store.current_identity("primary", "incumbent")
    assert candidate is not None and incumbent is not None
    client = client_of(pair)
    out = pair.canary("10ms")
    after = time.monotonic()
    deadline = after + 30
    while len([a for a in client.answers if a[0] > after]) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    answers = client.finish()

    assert out["state"] == "compensated", out
    assert "canary breach at 50 %" in out["reason"], out["reason"]
    assert "share-10" in out["results"] and "share-50" not in out["results"]
    # Every request goes to the incumbent again; the candidate is stopped, not removed.
    assert weights(pair) == {INCUMBENT_URL: ("UP", 100)}
    assert not running(candidate.container_id) and running(incumbent.container_id)
    assert pair.host.app().store.current_identity("primary", "incumbent") == incumbent
    # The client saw no failure but the candidate's injected faults; then the incumbent alone.
    failed = [(round(a[0] - after, 2), a[2]) for a in answers if a[2]]  # when, before the end
    assert all("injected fault (http-500)" in e for _, e in failed), (failed, out["results"])
    assert {a[1] for a in answers if a[0] > after} == {incumbent.served_model}
    # The breach is in the record: the step, the threshold, the failing round's values.
    shown = pair.run("audit", "show", out["tx_id"])
    [failed_step] = [e for e in shown["steps"] if e["step"] == "share-50" and e["event"] == "error"]
    data = failed_step["detail"]["data"]
    [breach] = data["breaches"]
    assert (breach["metric"], breach["op"]) == ("error_rate", "max"), breach
    assert breach["rounds"][0]["candidate"] > 0 and breach["rounds"][0]["incumbent"] == 0
    errors = [r["error"] for r in data["rounds"][-1]["candidate"]["requests"] if r["error"]]
    assert errors and all("HTTP 500" in e for e in errors), data["rounds"]
    assert "candidate ttft_p95" in data["samples"]
    [healthy] = [e for e in shown["steps"] if e["step"] == "share-10" and e["event"] == "result"]
    assert (healthy["detail"]["share"], healthy["detail"]["verdict"]) == (10, "healthy")


@pytest.mark.parametrize("pair", [("smg", ())], indirect=True)
def test_on_smg_the_canary_is_refused_before_anything_changes(pair: Pair) -> None:
    app = pair.host.app()
    candidate = app.store.current_identity("primary-b", "candidate")
    assert candidate is not None
    routed = httpx.post(
        f"{pair.host.camp.router.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {pair.host.camp.client_token}"},
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    out = pair.canary("1s")
    assert (out["_exit"], out["state"]) == (3, "refused"), out
    assert "router smg cannot split a tier's traffic by weight" in out["reason"]
    assert running(candidate.container_id)
    again = httpx.post(
        f"{pair.host.camp.router.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {pair.host.camp.client_token}"},
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert routed.json()["model"] == again.json()["model"] != CANDIDATE
    assert pair.host.app().store.current_identity("primary-b", "incumbent") is None


@pytest.mark.parametrize("pair", [("haproxy", ())], indirect=True)
def test_a_crash_during_a_step_is_compensated_by_recover(pair: Pair) -> None:
    app = pair.host.app()
    candidate = app.store.current_identity("primary-b", "candidate")
    assert candidate is not None
    crashed = pair.host.run(
        "promote",
        "--slot",
        "primary-b",
        "--canary",
        "10,50,100",
        "--step-watch",
        "10ms",
        "--profile",
        str(pair.profile),
        "--approved-by",
        "ops",
        env={**pair.env, "ANVIL_CRASH_AT": "canary:share-50:do:intent"},
    )
    assert crashed["_exit"] == -9, crashed
    assert weights(pair) == {INCUMBENT_URL: ("UP", 90), CANDIDATE_URL: ("UP", 10)}  # as it died
    recovered = pair.run("recover")
    assert recovered["_exit"] == 0, recovered
    [tx] = [t for t in recovered["recovered"] if t["kind"] == "canary"]
    assert tx["state"] == "compensated", tx
    assert weights(pair) == {INCUMBENT_URL: ("UP", 100)}
    assert not running(candidate.container_id)
    # The candidate stopped by the undo: its slot stands by, the incumbent's serves.
    assert phases(pair) == {"primary": ("serving", 0, []), "primary-b": ("standby", 0, [])}


@pytest.mark.parametrize("pair", [("haproxy", ())], indirect=True)
def test_a_crash_past_the_pivot_is_finished_forward_by_recover(pair: Pair) -> None:
    """Killed as the real-client acceptance begins (the candidate alone in the tier, the
    incumbent stopped): `recover` runs the acceptance, the VRAM reading and the record."""
    app = pair.host.app()
    candidate = app.store.current_identity("primary-b", "candidate")
    incumbent = app.store.current_identity("primary", "incumbent")
    assert candidate is not None and incumbent is not None
    crashed = pair.host.run(
        *["promote", "--slot", "primary-b", "--canary", "10,50,100", "--step-watch", "10ms"],
        *["--profile", str(pair.profile), "--approved-by", "ops"],
        env={**pair.env, "ANVIL_CRASH_AT": "canary:acceptance:do:intent"},
    )
    assert crashed["_exit"] == -9, crashed
    assert weights(pair) == {CANDIDATE_URL: ("UP", 1)}  # as it died: past the pivot, readmitted alone
    recovered = pair.run("recover")
    assert recovered["_exit"] == 0, recovered
    [tx] = [t for t in recovered["recovered"] if t["kind"] == "canary"]
    assert tx["state"] == "committed", tx
    shown = pair.run("audit", "show", tx["tx_id"])
    done = {e["step"] for e in shown["steps"] if e["event"] == "result"}
    assert {"acceptance", "vram-after-acceptance", "record-promotion"} <= done, done
    assert running(candidate.container_id) and not running(incumbent.container_id)
    assert phases(pair) == {"primary-b": ("serving", 0, []), "primary": ("standby", 0, [])}


def test_two_serves_that_do_not_fit_the_cards_together_are_refused(tmp_path: Path) -> None:
    """A candidate on the incumbent's GPU roles, loaded while the incumbent was stopped (its
    claim then holds no memory) and the incumbent started again: both need most of each card."""
    with campaign_host(tmp_path / "host", "haproxy") as host:
        p = Pair(host, *canary_pair(host.camp, tmp_path))
        gpu_candidate_recipe(Path(p.env["ANVIL_RECIPES_DIR"]))
        rt = DockerRuntime(gpu_mode="simulated")
        try:
            rt.stop(host.camp.incumbent_id, 10)
            out = p.run("load", "canary-gpu", "--slot", "primary-b")
            assert out["_exit"] == 0, out
            rt.start(host.camp.incumbent_id)
        finally:
            rt.close()
        verified_decision(host.app().store, "primary-b", "canary-{digest}")
        before = {url: w for url, (_status, w) in weights(p).items()}  # its check may be catching up
        out = p.canary("1s")
        assert (out["_exit"], out["state"]) == (3, "refused"), out
        assert out["refusal"]["guard"] == "ServesFitTogether"
        # The reserve in force: the campaign's waiver sets it to 0 for the pair.
        assert (
            "do not fit together on GPU role compute-a: 92000 + 94536 MiB + reserve 0 MiB = "
            "186536 MiB > capacity 97887 MiB"
        ) in out["reason"]
        assert out["refusal"]["data"]["waivers"]
        assert {url: w for url, (_status, w) in weights(p).items()} == before == {INCUMBENT_URL: 1}
        candidate = host.app().store.current_identity("primary-b", "candidate")
        assert candidate is not None and running(candidate.container_id)
