"""Token counts from the engine itself where its stream carries none, as its profile says: prompt
tokens by `plain-usage` (the request unstreamed, max_tokens 1, after the timed stream) or `tokenize`
(the raw text, an undercount), completion tokens by `stream-chunks`; the attempt records which.
"""

from __future__ import annotations

from dataclasses import replace

from anvil_ctl.core.engine_profile import EngineProfile
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.results import ChatResult, Usage


def message_text(body: JSONObject) -> str:
    """The text of a chat body's messages, concatenated (what a raw tokenizer can count)."""
    parts: list[str] = []
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


async def prompt_tokens(
    client: EngineClient, engine: EngineProfile, body: JSONObject
) -> tuple[int | None, JSONObject]:
    """(the engine's prompt-token count of `body`, how it was counted)."""
    how: JSONObject = {"prompt": engine.prompt_tokens}
    try:
        if engine.prompt_tokens == "plain-usage":
            plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            plain["max_tokens"] = 1
            answer = await client.chat(plain)
            if answer.usage is None:
                how["error"] = "the unstreamed request reported no usage"
                return None, how
            return answer.usage.prompt_tokens, how
        if engine.prompt_tokens == "tokenize" and engine.tokenizer is not None:
            count = await client.tokenize_count(
                engine.tokenizer, message_text(body), str(body.get("model", ""))
            )
            how["template"] = "not counted (raw message text)"
            return count, how
    except AnvilError as exc:
        how["error"] = f"{type(exc).__name__}: {exc}"
        return None, how
    how["error"] = f"the engine profile {engine.name} gives no way to count prompt tokens"
    return None, how


async def complete_usage(
    client: EngineClient, engine: EngineProfile, body: JSONObject, result: ChatResult
) -> tuple[ChatResult, JSONObject | None]:
    """`result` with the engine's own token counts as usage when its stream had none (unchanged, and
    None, when it has usage, was not streamed, or the engine should have streamed usage)."""
    if result.usage is not None or not result.streamed or engine.streamed_usage:
        return result, None
    prompt, how = await prompt_tokens(client, engine, body)
    how["completion"] = engine.completion_tokens
    completion = result.output_chunks if engine.completion_tokens == "stream-chunks" else None
    if prompt is None or completion is None:
        return result, how
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return replace(result, usage=usage), how


CALIBRATION_TOKENS = 1024
"""How long a filler sample the engine's tokenizer counts to calibrate prompt sizing."""


async def calibrate(
    client: EngineClient, engine: EngineProfile, served_model: str, default: float
) -> tuple[float, JSONObject]:
    """Characters per token of the prompt filler, counted by the engine's own tokenizer."""
    if engine.tokenizer is None:
        return default, {"chars_per_token": default, "source": "assumed (no tokenize endpoint)"}
    sample = prompts.filler(CALIBRATION_TOKENS, chars_per_token=default, salt="calibration")
    try:
        count = await client.tokenize_count(engine.tokenizer, sample, served_model)
    except AnvilError as exc:
        return default, {"chars_per_token": default, "source": f"assumed: tokenize failed: {exc}"}
    if count <= 0:
        return default, {"chars_per_token": default, "source": f"assumed: tokenizer counted {count}"}
    ratio = round(len(sample) / count, 4)
    return ratio, {
        "chars_per_token": ratio,
        "source": engine.tokenizer.path,
        "chars": len(sample),
        "tokens": count,
    }
