"""Real-client acceptance in a forked worker: the same answer as in this process, and no leftovers.

The worker imports `openai` in a child forked ahead of use (promote forks it before its
guards run); the parent never imports the client. Run against the stub engine, which
answers the OpenAI API as a routed serve does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from anvil_ctl.acceptance import run_acceptance
from anvil_ctl.acceptance_worker import AcceptanceResult, RealAcceptance
from anvil_ctl.adapters.credentials import Secret
from tests.unit import test_stub_server
from tests.unit.test_stub_server import StubFactory, free_port

stub = test_stub_server.stub  # the stub engine fixture, shared

MODEL = "stub-accept"
TOKEN = Secret("client-key", "test")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _warmed(url: str) -> RealAcceptance:
    """A real acceptance whose worker is forked (as promote forks it before its guards)."""
    acceptance = RealAcceptance(url, TOKEN)
    acceptance.warm()
    return acceptance


def _without_latency(doc: Any) -> Any:
    """The result with its measured times left out (they differ between any two runs)."""
    if isinstance(doc, dict):
        return {k: _without_latency(v) for k, v in doc.items() if not k.endswith(("_s", "_ms"))}
    if isinstance(doc, list):
        return [_without_latency(v) for v in doc]
    return doc


class TestAcceptanceWorker:
    def test_the_worker_answers_what_the_client_in_this_process_answers(self, stub: StubFactory) -> None:
        s = stub("--served-model", MODEL)
        worker = _warmed(s.url)
        pid = worker._pid
        assert pid
        forked = worker(MODEL, MODEL)
        here = AcceptanceResult(run_acceptance(s.url, MODEL, MODEL, TOKEN))
        assert forked.passed and here.passed, forked.as_dict()
        assert forked.failed_checks() == here.failed_checks() == []
        assert _without_latency(forked.as_dict()) == _without_latency(here.as_dict())
        assert _gone(pid)  # answered and reaped
        assert worker._pid is None  # a second call runs in this process

    def test_a_wrong_model_fails_the_checks_in_the_worker_as_in_this_process(self, stub: StubFactory) -> None:
        s = stub("--served-model", MODEL)
        forked = _warmed(s.url)("stub-accept", "another-model")
        here = AcceptanceResult(run_acceptance(s.url, "stub-accept", "another-model", TOKEN))
        assert not forked.passed and not here.passed
        assert forked.failed_checks() == here.failed_checks() != []

    def test_a_router_that_does_not_answer_fails_every_check(self) -> None:
        url = f"http://127.0.0.1:{free_port()}"
        forked = _warmed(url)(MODEL, MODEL)
        here = AcceptanceResult(run_acceptance(url, MODEL, MODEL, TOKEN))
        assert not forked.passed
        assert forked.failed_checks() == here.failed_checks() == ["plain", "stream", "tool"]
        assert _without_latency(forked.as_dict()) == _without_latency(here.as_dict())

    def test_an_unused_worker_ends_when_closed(self) -> None:
        worker = _warmed("http://127.0.0.1:9")
        pid = worker._pid
        assert pid and not _gone(pid)
        worker.close()
        assert _gone(pid)
        worker.close()  # twice is fine

    def test_unwarmed_real_acceptance_runs_in_this_process(self, stub: StubFactory) -> None:
        s = stub("--served-model", MODEL)
        acceptance = RealAcceptance(s.url, TOKEN)
        assert acceptance(MODEL, MODEL).passed
        acceptance.warm()
        assert acceptance(MODEL, MODEL).passed  # the worker's answer this time
        acceptance.close()


PARENT = """
import json, sys
from anvil_ctl.acceptance_worker import AcceptanceResult, RealAcceptance
from anvil_ctl.adapters.credentials import Secret
w = RealAcceptance(sys.argv[1], Secret("k", "test"))
w.warm()
print(json.dumps({"openai_here": "openai" in sys.modules, "passed": w(sys.argv[2], sys.argv[2]).passed,
                  "openai_after": "openai" in sys.modules}))
"""


class TestTheParent:
    def test_the_parent_never_imports_the_client(self, stub: StubFactory) -> None:
        s = stub("--served-model", MODEL)
        r = subprocess.run(
            [sys.executable, "-c", PARENT, s.url, MODEL], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == (
            '{"openai_here": false, "passed": true, "openai_after": false}'
        )
