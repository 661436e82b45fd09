"""Real-client acceptance: the official `openai` client through the router with the client key.

A plain chat, a streamed chat and a tool call, each bound to the expected served model;
evidence never holds the token. A 401/403 raises `AuthRejected`: credentials, not the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import openai
from openai.types.chat import ChatCompletion, ChatCompletionToolParam

from anvil_ctl.adapters.credentials import Secret
from anvil_ctl.core.errors import AuthRejected
from anvil_ctl.core.jsontypes import JSONArray, JSONObject, JSONValue
from anvil_ctl.log import get_logger

log = get_logger()

PLAIN_PROMPT = "Reply with exactly: anvil-acceptance-plain"
STREAM_PROMPT = "Reply with exactly: anvil-acceptance-stream"
TOOL_NAME = "lookup_slot"
TOOL_ARGS = {"slot": "primary", "detail": "served_model"}
TOOL_PROMPT = f"call `{TOOL_NAME}` with arguments JSON {json.dumps(TOOL_ARGS)}"
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Look up a serving slot.",
            "parameters": {
                "type": "object",
                "properties": {"slot": {"type": "string"}, "detail": {"type": "string"}},
                "required": ["slot", "detail"],
            },
        },
    }
]


def _check(name: str, passed: bool, evidence: JSONObject) -> JSONObject:
    return {"name": name, "passed": passed, "evidence": evidence}


def _plain(client: openai.OpenAI, alias: str, expected: str) -> JSONObject:
    reply = client.chat.completions.create(
        model=alias, messages=[{"role": "user", "content": PLAIN_PROMPT}], max_tokens=64
    )
    content = reply.choices[0].message.content if reply.choices else None
    ok = reply.model == expected and bool(content)
    return _check(
        "plain_chat",
        ok,
        {"model": reply.model, "content": (content or "")[:200], "finish": _finish(reply)},
    )


def _finish(reply: ChatCompletion) -> str | None:
    return reply.choices[0].finish_reason if reply.choices else None


def _stream(client: openai.OpenAI, alias: str, expected: str) -> JSONObject:
    started = time.monotonic()
    models: set[str] = set()
    chunks, text, done = 0, [], False
    first_token_s: float | None = None
    stream = client.chat.completions.create(
        model=alias,
        messages=[{"role": "user", "content": STREAM_PROMPT}],
        max_tokens=64,
        stream=True,
    )
    for chunk in stream:
        chunks += 1
        if chunk.model:
            models.add(chunk.model)
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                if first_token_s is None:
                    first_token_s = time.monotonic() - started
                text.append(choice.delta.content)
            if choice.finish_reason:
                done = True
    ok = models == {expected} and chunks > 1 and bool(text) and done
    return _check(
        "streaming_chat",
        ok,
        {
            "models": [*sorted(models)],
            "chunks": chunks,
            "content": "".join(text)[:200],
            "finished": done,
            "first_token_s": round(first_token_s, 3) if first_token_s is not None else None,
        },
    )


def _tool(client: openai.OpenAI, alias: str, expected: str) -> JSONObject:
    reply = client.chat.completions.create(
        model=alias,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
        tools=TOOLS,
        max_tokens=256,
    )
    calls = (reply.choices[0].message.tool_calls or []) if reply.choices else []
    seen: JSONArray = []
    ok_call = False
    for call in calls:
        fn = getattr(call, "function", None)
        if fn is None:
            continue
        try:
            args: JSONValue = json.loads(fn.arguments)
        except ValueError:
            args = None
        seen.append({"name": fn.name, "arguments": args})
        ok_call = ok_call or (fn.name == TOOL_NAME and args == TOOL_ARGS)
    return _check(
        "tool_call",
        reply.model == expected and ok_call,
        {"model": reply.model, "tool_calls": seen, "finish": _finish(reply)},
    )


CHECKS: tuple[Callable[[openai.OpenAI, str, str], JSONObject], ...] = (_plain, _stream, _tool)


def open_client(router_url: str, client_token: Secret) -> openai.OpenAI:
    """The official client for the router, its chat resource loaded; it sends nothing yet."""
    client = openai.OpenAI(
        base_url=router_url.rstrip("/") + "/v1",
        api_key=client_token.reveal(),
        timeout=60.0,
        max_retries=0,
    )
    _ = client.chat.completions  # imported on first use otherwise
    return client


def run_acceptance(
    router_url: str,
    alias: str,
    expected_model: str,
    client_token: Secret,
    *,
    client: openai.OpenAI | None = None,
) -> JSONObject:
    """Run the three real-client checks through `client` (closed here): router_url, alias,
    expected_model, credential_source, checks and whether all `passed`. AuthRejected on 401/403."""
    results: list[JSONObject] = []
    with client or open_client(router_url, client_token) as opened:
        for check in CHECKS:
            name = check.__name__.lstrip("_")
            try:
                results.append(check(opened, alias, expected_model))
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise AuthRejected(
                    f"router answered {exc.status_code} to the real-client acceptance: the token "
                    f"from {client_token.source} was refused (not a model failure)",
                    status=exc.status_code,
                    credential_source=client_token.source,
                ) from exc
            except openai.APIStatusError as exc:
                # The body is the router's or engine's error text; it never holds our token.
                error = str(exc.message)[:300]
                results.append(_check(name, False, {"status": exc.status_code, "error": error}))
            except openai.APIError as exc:
                results.append(_check(name, False, {"error": f"{type(exc).__name__}: {exc.message}"}))
    result: JSONObject = {
        "router_url": router_url,
        "alias": alias,
        "expected_model": expected_model,
        "credential_source": client_token.source,
        "checks": [*results],
        "passed": bool(results) and all(c["passed"] is True for c in results),
    }
    log.info(
        "acceptance.done",
        alias=alias,
        passed=result["passed"],
        checks={str(c["name"]): c["passed"] for c in results},
    )
    return result
