"""A serve's rollback identity: everything needed to bring it back exactly, and its digests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.jsontypes import JSONObject


@dataclass(frozen=True)
class Identity:
    """A serve's rollback identity, captured before any mutation; `missing()` names its empty fields."""

    slot: str
    container_id: str
    image_id: str
    config_fingerprint: str
    served_model: str
    context_tokens: int
    binding: str
    router_tier: str
    recipe_digest: str = ""
    model_identity: str = ""
    repo_digests: tuple[str, ...] = ()
    gpu_roles: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    container_name: str = ""
    engine_profile: str = ""
    """How to probe the serve (`core.engine_profile`); empty: the OpenAI-compatible assumptions."""

    REQUIRED = (
        "slot",
        "container_id",
        "image_id",
        "config_fingerprint",
        "served_model",
        "context_tokens",
        "binding",
        "router_tier",
    )

    def missing(self) -> list[str]:
        return [name for name in self.REQUIRED if not getattr(self, name)]

    def as_dict(self) -> JSONObject:
        data: JSONObject = asdict(self)
        data["repo_digests"] = list(sorted(self.repo_digests))
        data["gpu_roles"] = list(sorted(self.gpu_roles))
        data["aliases"] = list(sorted(self.aliases))
        if not self.engine_profile:
            # Identities recorded before engine profiles keep the digest they were recorded with.
            del data["engine_profile"]
        return data

    @property
    def digest(self) -> str:
        return sha256_hex(self.as_dict())

    @property
    def qualification_digest(self) -> str:
        """What a decision is bound to: the serve as configured, not the container instance.

        Loading the same recipe again keeps this digest (a decision still applies); any change of
        image, flags, env or mounts changes it.
        """
        return sha256_hex(
            {
                "recipe_digest": self.recipe_digest,
                "image_id": self.image_id,
                "model_identity": self.model_identity,
                "config_fingerprint": self.config_fingerprint,
                "served_model": self.served_model,
                "context_tokens": self.context_tokens,
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Identity:
        """An identity as `as_dict` wrote it; unknown keys are passed over, a wrong type is a ValueError."""
        absent = [name for name in cls.REQUIRED if name not in data]
        if absent:
            raise TypeError(f"Identity is missing required fields: {', '.join(absent)}")
        return cls(
            slot=_text(data, "slot"),
            container_id=_text(data, "container_id"),
            image_id=_text(data, "image_id"),
            config_fingerprint=_text(data, "config_fingerprint"),
            served_model=_text(data, "served_model"),
            context_tokens=_count(data, "context_tokens"),
            binding=_text(data, "binding"),
            router_tier=_text(data, "router_tier"),
            recipe_digest=_text(data, "recipe_digest"),
            model_identity=_text(data, "model_identity"),
            repo_digests=_texts(data, "repo_digests"),
            gpu_roles=_texts(data, "gpu_roles"),
            aliases=_texts(data, "aliases"),
            container_name=_text(data, "container_name"),
            engine_profile=_text(data, "engine_profile"),
        )


def _text(data: Mapping[str, object], key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"identity {key}: expected a string, got {type(value).__name__}")
    return value


def _count(data: Mapping[str, object], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"identity {key}: expected an integer, got {type(value).__name__}")
    return value


def _texts(data: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = data.get(key, ())
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"identity {key}: expected a list of strings")
    return tuple(str(v) for v in value)
