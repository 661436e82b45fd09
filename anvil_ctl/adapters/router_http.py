"""What both router adapters share: error translation, the routed chat, the readmission loop,
and `RouterHttp`, the data-plane half of the `Router` port. A 401/403 becomes `AuthRejected`
naming the credential's source, never its value."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Self

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.core.errors import AdapterError, AuthRejected, CredentialError, StepFailed, TransientError
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.core.model import Backend, RouteCheck, RoutedAnswer
from anvil_ctl.log import get_logger

log = get_logger()

READMIT_PROMPT = "Reply with exactly: anvil-readmit"
PROBE_ALIAS = "anvil.credential-probe"


class NotYetRouted(TransientError):
    """The router does not yet answer 200 from the expected model; worth another attempt."""


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn httpx transport failures into TransientError (they are retryable by nature)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise TransientError(f"{what}: timed out ({type(exc).__name__})", dependency="router") from exc
    except httpx.TransportError as exc:
        raise TransientError(f"{what}: {type(exc).__name__}: {exc}", dependency="router") from exc


def bearer(secret: Secret) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret.reveal()}"}


def reject_auth(response: httpx.Response, secret: Secret, what: str) -> None:
    """Raise AuthRejected for a 401/403, naming where the credential came from."""
    if response.status_code in (401, 403):
        meaning = "was rejected" if response.status_code == 401 else "lacks the role this call needs"
        raise AuthRejected(
            f"router answered {response.status_code} to {what}: the token from "
            f"{secret.source} {meaning}; check that credential (this is not a model failure)",
            status=response.status_code,
            credential_source=secret.source,
        )


def response_model(response: httpx.Response) -> tuple[str | None, str | None]:
    """(model, content) of a chat completion body, (None, None) when it is not one."""
    try:
        body: JSONValue = response.json()
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    model, choices = body.get("model"), body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    text = message.get("content") if isinstance(message, dict) else None
    return (model if isinstance(model, str) else None), (text if isinstance(text, str) else None)


def routed_chat(
    client: httpx.Client, base_url: str, alias: str, secret: Secret, *, timeout_s: float = 30.0
) -> RoutedAnswer:
    """One authenticated, non-streaming chat completion through the router to an alias."""
    with translated(f"routed chat to {alias!r} via {base_url}"):
        response = client.post(
            f"{base_url}/v1/chat/completions",
            headers=bearer(secret),
            json={
                "model": alias,
                "messages": [{"role": "user", "content": READMIT_PROMPT}],
                "max_tokens": 64,
                "stream": False,
            },
            timeout=timeout_s,
        )
    reject_auth(response, secret, f"a routed chat to {alias!r}")
    model, content = response_model(response)
    return RoutedAnswer(status=response.status_code, model=model, content=content)


def probe_client_token(client: httpx.Client, base_url: str, secret: Secret) -> int:
    """A harmless authenticated data-plane call: a chat to an alias no tier serves (any answer but
    401/403 proves the token; no backend sees it)."""
    with translated(f"client credential probe via {base_url}"):
        response = client.post(
            f"{base_url}/v1/chat/completions",
            headers=bearer(secret),
            json={"model": PROBE_ALIAS, "messages": [{"role": "user", "content": "probe"}]},
        )
    reject_auth(response, secret, "the client credential probe")
    return response.status_code


def answer_problem(answer: RoutedAnswer, alias: str, expected_model: str) -> str | None:
    """What is wrong with a routed answer (None: a 200 from the expected served model)."""
    if answer.status != 200:
        return f"routed chat to {alias!r} answered {answer.status}"
    if answer.model != expected_model:
        return f"routed chat to {alias!r} answered from {answer.model!r}, expected {expected_model!r}"
    return None


def check_answer(answer: RoutedAnswer, alias: str, expected_model: str) -> None:
    """Raise NotYetRouted unless the routed answer is a 200 from the expected served model."""
    problem = answer_problem(answer, alias, expected_model)
    if problem is not None:
        raise NotYetRouted(problem, status=answer.status, model=answer.model)


def readmit_loop(
    attempt: Callable[[], RoutedAnswer],
    *,
    what: str,
    deadline_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> RoutedAnswer:
    """Call `attempt` until it returns, retrying only TransientError (AuthRejected and the rest pass
    at once); at the deadline the last reason becomes StepFailed."""
    started = clock()

    def _past_deadline(_state: RetryCallState) -> bool:
        return clock() - started >= deadline_s

    def _log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.info("router.readmit.retry", target=what, attempt=state.attempt_number, reason=str(exc))

    retrying = Retrying(
        stop=_past_deadline,
        wait=wait_exponential(multiplier=0.25, max=2.0),
        retry=retry_if_exception_type(TransientError),
        before_sleep=_log_retry,
        sleep=sleep,
        reraise=True,
    )
    try:
        answer = retrying(attempt)
    except TransientError as exc:
        raise StepFailed(
            f"readmission of {what} did not complete within {deadline_s:.0f} s: {exc}",
            last_reason=str(exc),
            deadline_s=deadline_s,
        ) from exc
    log.info("router.readmit.done", target=what, model=answer.model, seconds=round(clock() - started, 3))
    return answer


class RouterHttp:
    """The data plane both routers serve alike; a router says where its readiness is and what
    stands in a route's way (`_route_problem`)."""

    NAME: str
    READY_PATH: str
    url: str
    _http: httpx.Client
    _client: Secret

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _listed(self, tier: str) -> list[tuple[Backend, JSONValue]]:
        """The tier's backends, each with the model the router says it serves (None: unknown)."""
        raise NotImplementedError

    def backends(self, tier: str) -> list[Backend]:
        return [backend for backend, _ in self._listed(tier)]

    def view(self, tier: str) -> JSONObject:
        """The router's view of a tier for snapshots (no secrets): backends by URL, readiness."""
        backends: list[JSONValue] = [
            {
                "url": b.url,
                "aliases": [*b.models],
                "observed_model": observed,
                "healthy": b.healthy,
                "state": b.state,
            }
            for b, observed in sorted(self._listed(tier), key=lambda listed: listed[0].url)
        ]
        return {"router": self.NAME, "tier": tier, "ready": self.ready(), "backends": backends}

    def _route_problem(self, tier: str, url: str) -> tuple[str, str]:
        """(what stands in the way of routing `tier` to `url`, "" if nothing; the alias to chat to)."""
        raise NotImplementedError

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        def verdict(reason: str = "") -> RouteCheck:
            return RouteCheck(tier, url, expected_model, holds=not reason, reason=reason)

        try:
            problem, alias = self._route_problem(tier, url)
            if problem:
                return verdict(problem)
            answer = self.routed_chat(alias)
        except CredentialError:
            raise  # an unsafe admin socket is configuration, not a missing route
        except AdapterError as exc:  # unreachable, busy or answering nonsense: no route to rely on
            return verdict(f"{self.NAME}: {exc}")
        return verdict(answer_problem(answer, alias, expected_model) or "")

    def routed_chat(self, alias: str) -> RoutedAnswer:
        return routed_chat(self._http, self.url, alias, self._client)

    def ready(self) -> bool:
        try:
            with translated(f"{self.NAME} GET {self.READY_PATH}"):
                response = self._http.get(f"{self.url}{self.READY_PATH}")
        except TransientError:
            return False
        return response.status_code == 200
