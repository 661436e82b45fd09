"""Never cut an answer, on real Docker with each router (smg, HAProxy) and the official `openai` client.

Streams longer than smg's old removal delay (5 s) are in flight through the router when
`load`, `rollback` and `unload` take their serve out of traffic: each ends with a
`finish_reason`, and the transaction's record says how many answers its drain waited for
and who counted them (the stub's gauge; on HAProxy the incumbent, adopted without one, is
counted by HAProxy's `scur`). A drain past its deadline refuses (load: exit 3, the
incumbent routed and serving) or cuts and counts the cut (rollback).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from scripts.campaign import INCUMBENT_MODEL
from scripts.chaos import ALIAS, BINDING, ChaosHost, recent_transactions
from tests.integration.conftest import campaign_host

pytestmark = pytest.mark.integration

TOKENS_PER_S = 1000  # the stub recipes' decode rate


@dataclass
class Stream:
    """One streamed chat by the official client, read to its end in a thread."""

    chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def join(self) -> Stream:
        assert self.thread is not None
        self.thread.join(timeout=120)
        return self


def stream(base_url: str, token: str, model: str, tokens: int) -> Stream:
    s = Stream()

    def read() -> None:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0, timeout=120)
        try:
            for chunk in client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "write at length"}],
                max_tokens=tokens,
                stream=True,
            ):
                s.chunks += 1
                s.started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    s.finish_reason = chunk.choices[0].finish_reason
        except openai.APIError as exc:
            s.error = repr(exc)
        finally:
            client.close()  # its pooled socket, not left to the garbage collector (ResourceWarning)
            s.started.set()

    s.thread = threading.Thread(target=read, daemon=True)
    s.thread.start()
    assert s.started.wait(30), "the stream never started"
    return s


# What counts the incumbent's answers in flight, by router: the stub's gauge behind smg (smg
# forgets a parked worker's load); HAProxy's `scur` for an incumbent adopted without a gauge.
INCUMBENT = {"smg": ("stub", "engine stub:num_requests_running"), "haproxy": ("openai-compatible", "router")}


@pytest.fixture(scope="module", params=sorted(INCUMBENT))
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosHost]:
    engine = INCUMBENT[request.param][0]
    with campaign_host(tmp_path_factory.mktemp("drain"), request.param, incumbent_engine=engine) as h:
        yield h


def routed(h: ChaosHost, seconds: float) -> list[Stream]:
    """Two streams through the router, each `seconds` long."""
    return [
        stream(h.camp.router.url, h.camp.client_token, ALIAS, int(seconds * TOKENS_PER_S)) for _ in range(2)
    ]


def drain_of(out: dict[str, Any], step: str) -> dict[str, Any]:
    result = out["results"][step]
    assert "drain" in result, result
    return dict(result["drain"])


class TestStreamsInFlightFinish:
    def test_load_waits_for_the_incumbents_streams(self, host: ChaosHost) -> None:
        assert host.prepare("load") == "A"
        streams = routed(host, 40)
        out = host.run(*host.argv("load"))
        assert out["state"] == "committed", out.get("reason")
        ends = [s.join() for s in streams]
        assert [(s.finish_reason, s.error) for s in ends] == [("length", None)] * 2, ends
        drain = drain_of(out, "stop-incumbent")
        assert (drain["cut"], drain["source"]) == (0, INCUMBENT[host.camp.router_kind][1]), drain
        assert drain["in_flight"] == 2, drain  # both were still running when it looked

    def test_rollback_waits_for_the_candidates_streams(self, host: ChaosHost) -> None:
        phase = host.prepare("rollback")
        streams = routed(host, 40)
        out = host.run(*host.argv("rollback", phase))
        assert out["state"] == "committed", out.get("reason")
        ends = [s.join() for s in streams]
        assert [(s.finish_reason, s.error) for s in ends] == [("length", None)] * 2, ends
        assert drain_of(out, "stop-current")["cut"] == 0

    def test_unload_waits_for_a_stream_to_the_candidate_directly(self, host: ChaosHost) -> None:
        assert host.prepare("promote") == "B"  # a loaded candidate, reached at its binding
        cand = host.candidate
        assert cand is not None
        direct = stream(BINDING, "unused", "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp", 40000)
        out = host.run("unload", cand, "--yes")
        assert out["state"] == "committed", out.get("reason")
        assert (direct.join().finish_reason, direct.error) == ("length", None)
        assert drain_of(out, "stop-candidate")["in_flight"] == 1
        host.run("rollback", "--slot", "primary")  # the incumbent serves again for what follows


@dataclass
class Asker:
    """Short chats through the router one after another, in a thread, until stopped: each
    answer's status, its Retry-After, and the model a 200 came from."""

    host: ChaosHost
    seen: list[tuple[int, str | None]] = field(default_factory=list)
    odd: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def __enter__(self) -> Asker:
        self.thread = threading.Thread(target=self._ask, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        assert self.thread is not None
        self.thread.join(30)

    def _ask(self) -> None:
        client = openai.OpenAI(
            base_url=self.host.camp.router.url + "/v1", api_key=self.host.camp.client_token, max_retries=0
        )
        try:
            while not self.done.is_set():
                try:
                    answer = client.chat.completions.create(
                        model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                    self.seen.append((200, answer.model))
                except openai.APIStatusError as exc:
                    self.seen.append((exc.status_code, exc.response.headers.get("retry-after")))
                    if exc.status_code not in (200, 503):
                        self.odd.append(f"{time.monotonic():.2f} {exc.status_code} {exc.response.text[:300]}")
                time.sleep(0.05)
        finally:
            client.close()

    def statuses(self) -> set[int]:
        return {status for status, _ in self.seen}

    def retry_afters(self) -> set[str | None]:
        return {extra for status, extra in self.seen if status == 503}


class TestTheWindow:
    def test_requests_while_no_serve_is_routed_get_503_with_retry_after_never_404(
        self, host: ChaosHost
    ) -> None:
        assert host.prepare("load") == "A"
        with Asker(host) as asker:
            out = host.run(*host.argv("load"))
            time.sleep(1)  # a committed load leaves the tier drained: the window goes on
        assert out["state"] == "committed", out.get("reason")
        assert 404 not in asker.statuses() and asker.statuses() <= {200, 503}, asker.odd
        assert asker.retry_afters() == {"1"}, asker.seen
        assert asker.seen[0][0] == 200 and asker.seen[-1][0] == 503  # served before, retryable after

    def test_load_promote_routes_a_candidate_qualified_before_in_the_same_run(self, host: ChaosHost) -> None:
        host.prepare("promote")  # loaded once and verified: the decision binds its identity
        assert host.prepare("load") == "A"
        host.unload_stopped_candidates()
        known = {t["tx_id"] for t in recent_transactions(host.app())}
        with Asker(host) as asker:
            out = host.run(*host.argv("load"), "--promote", "tester")
            deadline = time.monotonic() + 30
            while asker.seen[-1][0] != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert (out["_exit"], out["state"], out["then"]["state"]) == (0, "committed", "committed"), out
        assert {out["tx_id"], out["then"]["tx_id"]}.isdisjoint(known)
        assert 404 not in asker.statuses() and asker.statuses() <= {200, 503}, asker.odd
        # Every 503 says when to come back. There may be none: smg retries the parking
        # responder's 503 with its own backoff, and a window this short can end before the
        # request's retries run out, so the request is answered by the candidate instead.
        assert asker.retry_afters() <= {"1"}, asker.seen
        served = [extra for status, extra in asker.seen if status == 200]
        candidate_model = "glm53-flash-ormandj-sglang-sm120-tp2-393k-c1-adaptive-mtp"
        assert (served[0], served[-1]) == (INCUMBENT_MODEL, candidate_model), served
        assert host.phase_of(host.observe()) == "C"  # the candidate routed, the incumbent retained


class TestDeadline:
    def test_load_refuses_to_cut_and_the_incumbent_stays_routed(self, host: ChaosHost) -> None:
        assert host.prepare("load") == "A"
        (long,) = [stream(host.camp.router.url, host.camp.client_token, ALIAS, 20 * TOKENS_PER_S)]
        started = time.monotonic()
        out = host.run(*host.argv("load"), "--drain-timeout", "1s")
        assert out["_exit"] == 3, out
        assert out["state"] == "compensated" and "still in flight" in out["reason"], out
        assert (long.join().finish_reason, long.error) == ("length", None)
        assert time.monotonic() - started >= 5  # it waited, and never cut
        assert host.phase_of(host.observe()) == "A"  # routed and serving as before

    def test_rollback_cuts_at_its_deadline_and_the_record_counts_the_cut(self, host: ChaosHost) -> None:
        phase = host.prepare("rollback")
        # Longer than the drained engine's stop grace (the stub's 10 s, openai-compatible's 30 s):
        # the stub finishes streams on SIGTERM within it, and this one must still be cut.
        long = stream(host.camp.router.url, host.camp.client_token, ALIAS, 50 * TOKENS_PER_S)
        out = host.run(*host.argv("rollback", phase), "--drain-timeout", "1s")
        assert out["state"] == "committed", out.get("reason")
        drain = drain_of(out, "stop-current")
        # From A the incumbent is drained, from C the stub candidate, with its gauge.
        source = INCUMBENT[host.camp.router_kind][1] if phase == "A" else "engine stub:num_requests_running"
        assert (drain["cut"], drain["source"]) == (1, source), drain
        assert long.join().finish_reason is None  # the one answer cut, and counted
        shown = host.run("audit", "show", out["tx_id"])
        assert '"cut": 1' in str(shown).replace("'", '"'), shown


def _draining(host: ChaosHost) -> bool:
    """The newest load journaled its stop-incumbent intent and no result: its drain waits."""
    ctx = host.app()
    loads = [t for t in recent_transactions(ctx) if t["kind"] == "load"]
    if not loads:
        return False
    events = [(e.step, e.event) for e in ctx.store.step_events(loads[0]["tx_id"])]
    return ("stop-incumbent", "intent") in events and ("stop-incumbent", "result") not in events


class TestKilledDuringTheDrain:
    def test_recover_converges_with_the_incumbent_routed_and_its_answer_finished(
        self, host: ChaosHost
    ) -> None:
        assert host.prepare("load") == "A"
        known = {t["tx_id"] for t in recent_transactions(host.app())}
        long = stream(host.camp.router.url, host.camp.client_token, ALIAS, 40 * TOKENS_PER_S)
        proc = subprocess.Popen(
            [sys.executable, "-m", "anvil_ctl", "--json", *host.argv("load")],
            env=host.camp.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while not _draining(host) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _draining(host), "the load never reached its drain"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert recent_transactions(host.app())[0]["tx_id"] not in known
        recovered = host.run("recover")
        assert recovered["_exit"] == 0, recovered
        assert host.phase_of(host.observe()) == "A"  # the incumbent routed and serving again
        assert (long.join().finish_reason, long.error) == ("length", None)
