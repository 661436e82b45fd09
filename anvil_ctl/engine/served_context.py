"""Observe a serve's context length the way its engine profile says it shows: `models`
(`max_model_len` in /v1/models), `refusal` (a prompt of the recorded length is refused with
a 400 naming the real length, or accepted, which is drift too) or `none` (unobservable)."""

from __future__ import annotations

from dataclasses import dataclass

from anvil_ctl.core.engine_profile import EngineProfile, engine_profile
from anvil_ctl.core.errors import AdapterError
from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.engine.world import World

INCONCLUSIVE = frozenset({"probe-failed", "accepted"})


@dataclass(frozen=True)
class ContextObservation:
    """What the engine showed of its context length, and how it was seen."""

    value: int | None
    how: str
    """max_model_len | not-reported | refusal | accepted | probe-failed | unobservable"""
    detail: JSONValue = None

    def matches(self, recorded: int) -> bool:
        """True when nothing observed contradicts `recorded` (an engine that reports no
        length and has no other way to show it does not contradict it)."""
        if self.how in INCONCLUSIVE:
            return False
        return self.value is None or self.value == recorded

    def describe(self) -> str:
        """What was seen, in words: `reports max_model_len 2048`, `refuses ...`."""
        if self.how == "max_model_len":
            return f"reports max_model_len {self.value}"
        if self.how == "refusal":
            return f"refuses prompts of {self.value} tokens or more (context length {self.value})"
        if self.how == "accepted":
            words = self.detail.get("prompt_words") if isinstance(self.detail, dict) else None
            return f"accepted a prompt of {words} tokens (context longer than recorded)"
        if self.how == "probe-failed":
            return f"could not be probed for its context length: {self.detail}"
        return f"shows no context length ({self.how})"

    def as_dict(self) -> JSONObject:
        return {"value": self.value, "how": self.how, "detail": self.detail}


def observe_context(
    world: World, profile: EngineProfile, base_url: str, served_model: str, expected: int
) -> ContextObservation:
    """The context length the engine at `base_url` shows, per `profile` (see module doc)."""
    if profile.context_source == "models":
        lens: list[int | None] = [m.max_model_len for m in world.server.models(base_url)]
        if len(lens) == 1 and lens[0] is not None:
            return ContextObservation(int(lens[0]), "max_model_len", list(lens))
        return ContextObservation(None, "not-reported", list(lens))
    if profile.context_source == "refusal":
        try:
            answer = world.server.probe_prompt(base_url, served_model, expected)
        except AdapterError as exc:
            return ContextObservation(None, "probe-failed", str(exc))
        detail: JSONObject = {"status": answer.status, "seconds": answer.seconds, "prompt_words": expected}
        if answer.status == 400:
            limit = profile.refused_context(answer.body)
            if limit is None:
                return ContextObservation(None, "probe-failed", {**detail, "body": answer.body[:300]})
            return ContextObservation(limit, "refusal", detail)
        if answer.status == 200:
            return ContextObservation(None, "accepted", detail)
        return ContextObservation(None, "probe-failed", {**detail, "body": answer.body[:300]})
    return ContextObservation(None, "unobservable", None)


def observed_context(world: World, ident: Identity) -> ContextObservation:
    """`observe_context` for a recorded serve on its slot's binding."""
    slot = world.config.slot(ident.slot)
    profile = engine_profile(ident.engine_profile)
    return observe_context(world, profile, slot.base_url, ident.served_model, ident.context_tokens)
