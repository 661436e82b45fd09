"""Token counts from the engine itself where its stream carries none, as its profile says.

Some engines end a stream without a usage chunk even when asked for one (llama-cpp-python).
A gate then still needs the prompt and completion tokens of what it measured, counted by
the engine, never by a rule of ours:

- prompt tokens `plain-usage`: the same request again, unstreamed, with max_tokens 1,
  sent after the timed stream finished (so the timing is untouched); its `usage` is the
  engine's count over the rendered chat template, and the engine's prefix cache makes
  it cheap. `tokenize`: the engine's tokenize endpoint over the raw message text (no
  template: an undercount, recorded as such);
- completion tokens `stream-chunks`: one per chunk that carried output (an engine that
  streams one token per chunk).

The result carries the counts as its `usage`; the attempt records how they were counted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from anvil_ctl.core.engine_profile import EngineProfile
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.qualify.client import EngineClient
from anvil_ctl.qualify.results import ChatResult, Usage


def message_text(body: dict[str, Any]) -> str:
    """The text of a chat body's messages, concatenated (what a raw tokenizer can count)."""
    parts = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


async def prompt_tokens(
    client: EngineClient, engine: EngineProfile, body: dict[str, Any]
) -> tuple[int | None, dict[str, Any]]:
    """(the engine's prompt-token count of `body`, how it was counted)."""
    how: dict[str, Any] = {"prompt": engine.prompt_tokens}
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
            tok = engine.tokenizer
            count = await client.tokenize_count(
                tok.path,
                message_text(body),
                input_field=tok.input_field,
                count_field=tok.count_field,
                model_field=tok.model_field,
                model=str(body.get("model", "")),
            )
            how["template"] = "not counted (raw message text)"
            return count, how
    except AnvilError as exc:
        how["error"] = f"{type(exc).__name__}: {exc}"
        return None, how
    how["error"] = f"the engine profile {engine.name} gives no way to count prompt tokens"
    return None, how


async def complete_usage(
    client: EngineClient, engine: EngineProfile, body: dict[str, Any], result: ChatResult
) -> tuple[ChatResult, dict[str, Any] | None]:
    """`result` with the engine's own token counts as usage when its stream had none.

    Returns the result unchanged (and None) when it has usage, was not streamed, or the
    engine streams usage (then a missing usage chunk is the engine's failure to report).
    """
    if result.usage is not None or not result.streamed or engine.streamed_usage:
        return result, None
    prompt, how = await prompt_tokens(client, engine, body)
    how["completion"] = engine.completion_tokens
    completion = result.output_chunks if engine.completion_tokens == "stream-chunks" else None
    if prompt is None or completion is None:
        return result, how
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return replace(result, usage=usage), how
