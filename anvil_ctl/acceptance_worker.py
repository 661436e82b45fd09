"""Real-client acceptance in a forked worker, so that `openai` imports on another core meanwhile.

Warning: the child is a copy of the command and touches nothing it inherited (database,
Docker and router clients); it reads its pipe, runs `run_acceptance`, answers one JSON line
and leaves with `os._exit`. It also leaves when its request pipe closes (the parent died).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anvil_ctl.core.errors import AdapterError, AuthRejected
from anvil_ctl.core.jsontypes import JSONObject, get_object, get_objects

if TYPE_CHECKING:
    from anvil_ctl.adapters.credentials import Secret


def _child(requests: int, answers: int, router_url: str, token: Secret) -> None:
    """The forked child: import the client, wait for the request, answer it; never returns."""
    code = 0
    try:
        from anvil_ctl.acceptance import open_client, run_acceptance

        client = None
        with contextlib.suppress(Exception):  # else built when asked, and its error answered
            client = open_client(router_url, token)  # before the ask: it sends nothing
        with os.fdopen(requests, "rb") as rq:
            line = rq.readline()
        if line:
            ask = json.loads(line)
            answer: JSONObject
            try:
                result = run_acceptance(
                    router_url, str(ask["alias"]), str(ask["model"]), token, client=client
                )
                answer = {"result": result}
            except AuthRejected as exc:
                answer = {"auth_rejected": str(exc), "data": json.loads(json.dumps(exc.data, default=str))}
            except Exception as exc:  # the parent raises it as the step's failure
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(answers, "wb") as out:
                out.write(json.dumps(answer).encode() + b"\n")
    except BaseException:  # Ctrl-C reaches the whole process group; the parent reports it
        code = 1
    os._exit(code)


@dataclass(frozen=True)
class AcceptanceResult:
    """What `run_acceptance` found, as the dict it returns (in this process or the worker's
    answer), read here without importing `openai`."""

    result: JSONObject

    @property
    def passed(self) -> bool:
        return self.result.get("passed") is True

    def failed_checks(self) -> list[str]:
        return [str(c["name"]) for c in get_objects(self.result, "checks") if c.get("passed") is not True]

    def as_dict(self) -> JSONObject:
        return dict(self.result)


class RealAcceptance:
    """Real-client acceptance with the router's client token; `warm()` forks its worker ahead of
    use (see the module docstring), unwarmed it runs in this process."""

    def __init__(self, router_url: str, token: Secret) -> None:
        self.router_url, self.token = router_url, token
        self._pid: int | None = None
        self._requests = self._answers = -1

    def warm(self) -> None:
        if self._pid is not None:
            return
        req_r, self._requests = os.pipe()
        self._answers, ans_w = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:
            os.close(self._requests)
            os.close(self._answers)
            _child(req_r, ans_w, self.router_url, self.token)
        os.close(req_r)
        os.close(ans_w)

    def __call__(self, alias: str, model: str) -> AcceptanceResult:
        if self._pid is None:
            from anvil_ctl.acceptance import run_acceptance  # openai: only here

            return AcceptanceResult(run_acceptance(self.router_url, alias, model, self.token))
        with contextlib.suppress(OSError):  # the child died: its answer is empty, reported below
            os.write(self._requests, json.dumps({"alias": alias, "model": model}).encode() + b"\n")
        with os.fdopen(self._answers, "rb", closefd=False) as ans:
            line = ans.readline()
        self.close()
        if not line:
            raise AdapterError("the real-client acceptance worker ended without an answer")
        answer = json.loads(line)
        if "auth_rejected" in answer:
            data = answer.get("data") or {}
            raise AuthRejected(str(answer["auth_rejected"]), **data)
        if "error" in answer:
            raise AdapterError(f"real-client acceptance: {answer['error']}")
        return AcceptanceResult(get_object(answer, "result"))

    def close(self) -> None:
        """End the worker and reap it; a child never asked (a refused promote) is killed."""
        pid, self._pid = self._pid, None
        if not pid:
            return
        os.close(self._requests)
        os.close(self._answers)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
