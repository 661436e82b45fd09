"""A serve's rollback identity: everything needed to bring it back exactly, and its digests."""

from __future__ import annotations

import functools
from dataclasses import MISSING, asdict, dataclass, fields
from typing import TYPE_CHECKING

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.jsontypes import JSONObject

if TYPE_CHECKING:
    from pydantic import TypeAdapter


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

    def missing(self) -> list[str]:
        """The required fields (those without a default) that are empty."""
        return [f.name for f in fields(self) if f.default is MISSING and not getattr(self, f.name)]

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
    def from_json(cls, text: str | bytes) -> Identity:
        """An identity as `as_dict` wrote it, as JSON; unknown keys are passed over, a missing field
        or a value of another JSON type is a ValueError (pydantic's, naming the field)."""
        return _adapter().validate_json(text, strict=True)


@functools.cache
def _adapter() -> TypeAdapter[Identity]:
    from pydantic import TypeAdapter

    return TypeAdapter(Identity)
