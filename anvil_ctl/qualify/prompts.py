"""Deterministic prompt material: context filler to a nominal token target, needles, tools.

Prompts follow the answer rules of docs/CONTRACTS.md, phrased so a real model answers as the
stub does. Targets assume `chars_per_token` characters per token; gates report measured usage.
"""

from __future__ import annotations

import json

from anvil_ctl.core.jsontypes import JSONObject

# Sentences without any of the trigger phrases of the answer rules, numbered so
# the text does not repeat exactly (real engines would otherwise cache or compress it).
_SENTENCES = (
    "The river carried silt from the northern hills toward the wide delta.",
    "Engineers measured the bridge each spring and logged every small crack.",
    "A quiet library kept maps of coastlines that no longer exist.",
    "The orchard keeper counted apples by the crate and wrote totals in chalk.",
    "Trains crossed the plain at dawn, their lights fading into the fog.",
    "The observatory recorded the brightness of distant stars every night.",
    "Bakers in the old quarter rose before the bells to light their ovens.",
    "A cartographer corrected the height of the pass after a long survey.",
)


def filler(target_tokens: int, *, chars_per_token: float = 4.0, salt: str = "") -> str:
    """Neutral numbered text of about `target_tokens` tokens (at `chars_per_token`)."""
    target_chars = max(0, int(target_tokens * chars_per_token))
    text = f"[{salt}] " if salt else ""
    i = 0
    while len(text) < target_chars:
        text += f"{i}. {_SENTENCES[i % len(_SENTENCES)]} "
        i += 1
    return text[:target_chars]


MESSAGE_OVERHEAD_TOKENS = 8
"""Tokens the stub charges per message; a budget for real templates too."""


def context_prompt(
    nominal_tokens: int,
    question: str,
    *,
    reserve_tokens: int,
    chars_per_token: float = 4.0,
    needle: str | None = None,
    needle_depth: float = 0.5,
) -> str:
    """Filler sized so that prompt + `reserve_tokens` of output fits `nominal_tokens`,
    then the question on its own line; a needle sentence is placed at `needle_depth`."""
    question_tokens = int(len(question) / chars_per_token) + 1
    body_tokens = max(16, nominal_tokens - reserve_tokens - question_tokens - MESSAGE_OVERHEAD_TOKENS)
    text = filler(body_tokens, chars_per_token=chars_per_token)
    if needle is not None:
        sentence = f" The needle is {needle}. "
        cut = int(len(text) * needle_depth)
        # Keep the needle on a sentence boundary so it reads as its own sentence.
        boundary = text.rfind(". ", 0, cut)
        cut = boundary + 2 if boundary >= 0 else cut
        text = text[:cut] + sentence + text[cut + len(sentence) :]
    return f"{text}\n\n{question}"


def reply_exactly(marker: str) -> str:
    return f"Answer with the marker only, no other words.\nReply with exactly: {marker}"


def tool_instruction(name: str, arguments: JSONObject) -> str:
    """The stub's tool rule: the JSON object runs to the end of its line."""
    return (
        "Use the tool now; do not answer in text.\n"
        f"call `{name}` with arguments JSON {json.dumps(arguments, separators=(', ', ': '))}"
    )


def json_instruction(value: JSONObject) -> str:
    return (
        "Output JSON only, no prose and no code fence.\n"
        f"Return exactly this JSON: {json.dumps(value, separators=(', ', ': '))}"
    )


def function_tool(name: str, description: str, properties: JSONObject) -> JSONObject:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": [*sorted(properties)],
                "additionalProperties": False,
            },
        },
    }


RECORD_TOOL = function_tool(
    "record_value",
    "Record one value in the ledger.",
    {
        "ledger": {"type": "string"},
        "index": {"type": "integer"},
        "amount": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
)
LOOKUP_TOOL = function_tool(
    "lookup_order",
    "Look up an order by its ID.",
    {"order_id": {"type": "string"}, "include_items": {"type": "boolean"}},
)
TOOLS: list[JSONObject] = [RECORD_TOOL, LOOKUP_TOOL]

SYSTEM_TOOLS = (
    "You are a precise assistant connected to tools. When the user asks you to call a tool "
    "with given arguments, call exactly that tool with exactly those arguments, unchanged. "
    "When a tool result arrives, reply with exactly: Tool result received: <the tool result>"
)
