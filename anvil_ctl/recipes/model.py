"""The recipe model: one pinned, validated serve, read from its TOML file, and its digest.

Values its sources do not give are never invented: they stay absent and are listed in
`unknown`, which makes the recipe not runnable. The digest covers content, not location.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, field_validator, model_validator

from anvil_ctl.config.fields import NAME_RE, Duration, MiB, Strict, text_field, valid_if
from anvil_ctl.config.inputs import format_validation_error, load_toml
from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.engine_profile import ENGINE_PROFILES, EngineProfile, engine_profile
from anvil_ctl.core.errors import RecipeError
from anvil_ctl.core.model import DEFAULT_DRAIN_TIMEOUT_S, ModelFile
from anvil_ctl.core.validate import MAX_CONTEXT_TOKENS, MAX_COUNT

MODEL_IDENTITY_RE = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)@(?P<rev>[0-9a-f]{40})\Z", re.ASCII
)
IMAGE_DIGEST_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}\Z")
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}\Z")
SHM_SIZE_RE = re.compile(r"^[0-9]{1,15}[bkmgBKMG]?\Z")
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")

# Engines that serve no Hugging Face model, so `model` may be absent without being unknown.
ENGINES_WITHOUT_MODEL = frozenset({"stub"})

# Fields that may be left absent when the recipe lists them in `unknown`.
_ABSENT_IF_UNKNOWN = ("model", "served_model", "max_concurrency")


# Recipe values end up in container specs, records and terminals: bounded, no control characters.
Line = Annotated[str, text_field(1000)]
Arg = Annotated[str, text_field(8192, multiline=True)]
_ABSOLUTE = valid_if(lambda v: v.startswith("/"), "expected an absolute path inside the container")
LIMIT = 2**62  # ulimits are 64-bit in the kernel; -1 means unlimited


class RecipeMount(Strict):
    """A bind mount; a relative source resolves against the recipe file's directory."""

    source: Line = Field(min_length=1, description="Host path, absolute or relative to the recipe")
    target: Annotated[Line, _ABSOLUTE] = Field(description="Absolute path inside the container")
    read_only: bool = Field(True, description="Mount read-only")


class RecipeModelFile(Strict):
    """A file of the pinned model the engine loads: checked byte for byte before `load`."""

    path: Annotated[
        Line,
        valid_if(
            lambda v: not v.startswith("/") and ".." not in v.split("/"),
            "expected a path inside the snapshot (relative, no '..')",
        ),
    ] = Field(min_length=1, description="Path inside the model's snapshot directory")
    sha256: Annotated[str, valid_if(SHA256_RE.match, "expected 64 lowercase hex digits")] = Field(
        description="SHA-256 of the file's bytes, 64 lowercase hex"
    )
    bytes: int = Field(gt=0, le=LIMIT, description="Size of the file in bytes")

    def pin(self) -> ModelFile:
        return ModelFile(self.path, self.sha256, self.bytes)


class Ulimit(Strict):
    soft: int = Field(ge=-1, le=LIMIT, description="Soft limit; -1 is unlimited")
    hard: int = Field(ge=-1, le=LIMIT, description="Hard limit; -1 is unlimited")


class ExternalPrior(Strict):
    """A figure the upstream source published: evidence of its own, never a local measurement."""

    figure: str = Field(min_length=1, description="The figure as published, e.g. '~8,100 tok/s prefill'")
    conditions: str = Field("", description="The conditions the source states (hardware, OS, context)")
    where: str = Field(min_length=1, description="Where the source published it")


class RecipeSource(Strict):
    """Where a recipe comes from upstream, as the source published it."""

    repository: str | None = Field(None, description="Upstream repository, e.g. github.com/ORG/NAME")
    release: str | None = Field(None, description="Release tag the recipe follows, e.g. v0.1.1-rc.14")
    commit: (
        Annotated[str, valid_if(COMMIT_RE.match, "expected a git commit of 7 to 40 lowercase hex digits")]
        | None
    ) = Field(None, description="Source commit of that release (7-40 hex)")
    image_tag: str | None = Field(None, description="Image tag as published (informational: tags move)")
    image_digest: (
        Annotated[
            str,
            valid_if(
                lambda v: IMAGE_ID_RE.match(v) or IMAGE_DIGEST_RE.match(v),
                "expected sha256:<64 hex> or NAME@sha256:<64 hex>",
            ),
        ]
        | None
    ) = Field(None, description="Image digest as published, sha256:<64 hex>")
    url: str | None = Field(None, description="Release notes or recipe page")
    notes: str = Field("", description="What the source says of itself (e.g. not upstream-qualified)")
    external_prior: tuple[ExternalPrior, ...] = Field(
        (), description="Figures the source published: external-prior evidence, not measured here"
    )


class Recipe(Strict):
    """One serve, pinned: model, image, served identity, shape, container and provenance."""

    name: Annotated[
        str, valid_if(NAME_RE.match, "expected lowercase letters, digits, '.', '_' or '-' (max 63)")
    ] = Field(description="Recipe name; equals the file name without .toml")
    description: Line = Field("", description="One line for listings")
    engine: Line = Field(min_length=1, description="Engine kind: stub, sglang, exllamav3, ...")
    engine_profile: Line | None = Field(
        None,
        description="How to probe the engine (anvil_ctl.core.engine_profile); default the profile "
        "named like `engine`, else the OpenAI-compatible assumptions",
    )
    model: (
        Annotated[
            str,
            valid_if(
                MODEL_IDENTITY_RE.match,
                "expected a pinned model identity ORG/NAME@<40 lowercase hex revision>",
            ),
        ]
        | None
    ) = Field(None, description="Model identity repo@<40-hex revision>")
    model_files: tuple[RecipeModelFile, ...] = Field(
        (), max_length=1024, description="Files of the model the engine loads, pinned by size and SHA-256"
    )
    model_mount: Annotated[Line, _ABSOLUTE] | None = Field(
        None,
        description="Container path where the model's repository folder of the host config's "
        "model_cache_dir is mounted read-only (the snapshot's links into blobs resolve there)",
    )
    image: str = Field(description="name@sha256:<64 hex> or a local image ID sha256:<64 hex>")
    served_model: Line | None = Field(None, min_length=1, description="Id /v1/models must report")
    context_tokens: int = Field(
        gt=0, le=MAX_CONTEXT_TOKENS, description="Configured context (max model length) in tokens"
    )
    max_concurrency: int | None = Field(None, gt=0, le=MAX_COUNT, description="Maximum running requests")
    tp_size: int = Field(ge=1, le=64, description="Tensor-parallel size")
    gpu_roles: tuple[str, ...] = Field(max_length=64, description="GPU role names, one per TP rank")
    gpu_roles_reason: Line = Field("", description="Why gpu_roles differs from tp_size, if it does")
    vram_need_mib: MiB = Field(
        0,
        description="MiB per card the serve holds once started; `load` waits for this plus the "
        "reserve to be free on each of its cards before starting it (0: only the reserve)",
    )
    port: int = Field(gt=0, lt=65536, description="Port the engine listens on; equals the slot's")
    health_path: (
        Annotated[Line, valid_if(lambda v: v.startswith("/"), "expected a path starting with '/'")] | None
    ) = Field(None, description="Path answering 200 when healthy; default the engine profile's")
    startup_timeout_s: Duration = Field(600.0, description="Deadline for health and identity")
    drain_timeout_s: Duration = Field(
        DEFAULT_DRAIN_TIMEOUT_S,
        description="How long `load` waits for the incumbent's answers in flight before it gives up "
        "(the incumbent stays routed; `--on-drain-timeout cut` goes on instead); default 300 s, a "
        "long-context answer at the seeds' speeds",
    )
    profile: Line = Field(min_length=1, description="Qualification profile name")
    entrypoint: tuple[Arg, ...] | None = Field(None, max_length=256, description="Container entrypoint")
    args: tuple[Arg, ...] = Field(
        (), max_length=1024, description="Container command (arguments to the entrypoint)"
    )
    env: dict[Line, Arg] = Field(default_factory=dict, max_length=1024, description="Container environment")
    mounts: tuple[RecipeMount, ...] = Field((), max_length=256, description="Bind mounts")
    shm_size: (
        Annotated[str, valid_if(SHM_SIZE_RE.match, "expected a size such as 16g, 512m or a number of bytes")]
        | None
    ) = Field(None, description="Size of /dev/shm, e.g. 32g")
    ipc_mode: Line | None = Field(None, description="IPC mode: host, private, shareable")
    ulimits: dict[Line, Annotated[int, Field(ge=-1, le=LIMIT)] | Ulimit] = Field(
        default_factory=dict, description="name -> limit"
    )
    unknown: tuple[Line, ...] = Field((), description="Fields (dotted) the sources do not give")
    assumed: tuple[Line, ...] = Field((), description="Fields (dotted) we chose, not from sources")
    notes: Annotated[str, text_field(20000, multiline=True)] = Field("", description="Free-form notes")
    provenance: dict[str, object] = Field(default_factory=dict, description="Where values came from")
    source: RecipeSource | None = Field(
        None, description="Upstream release, commit, image tag and digest as published, external figures"
    )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if IMAGE_DIGEST_RE.match(value) or IMAGE_ID_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not pinned; expected a repo digest NAME@sha256:<64 hex> or a local "
            "image ID sha256:<64 hex> (a tag such as NAME:latest can move)"
        )

    @field_validator("engine_profile")
    @classmethod
    def _engine_profile(cls, value: str | None) -> str | None:
        if value is not None and value not in ENGINE_PROFILES:
            raise ValueError(f"{value!r} is not an engine profile; expected one of {sorted(ENGINE_PROFILES)}")
        return value

    @field_validator("gpu_roles")
    @classmethod
    def _roles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("expected distinct role names")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if len(self.gpu_roles) != self.tp_size and not self.gpu_roles_reason:
            raise ValueError(
                f"gpu_roles: {len(self.gpu_roles)} roles for tp_size {self.tp_size}; expected "
                "one role per rank, or state why in gpu_roles_reason"
            )
        fields = type(self).model_fields
        for entry in (*self.unknown, *self.assumed):
            if entry.split(".", 1)[0] not in fields:
                raise ValueError(f"unknown/assumed: {entry!r} does not start with a recipe field")
        for entry in self.unknown:
            if "." not in entry and entry in self.model_fields_set:
                raise ValueError(f"unknown: {entry!r} is given a value and listed as unknown")
        published = self.source.image_digest if self.source else None
        if published and "@sha256:" in self.image:
            pinned = self.image.split("@", 1)[1]
            if published.rsplit("@", 1)[-1] != pinned:
                raise ValueError(
                    f"source.image_digest: {published} differs from the pinned image {self.image}; "
                    "expected the digest the source published"
                )
        for name in _ABSENT_IF_UNKNOWN:
            exempt = name == "model" and self.engine in ENGINES_WITHOUT_MODEL
            if getattr(self, name) is None and name not in self.unknown and not exempt:
                raise ValueError(f"{name}: required; give it, or list it in unknown if no source does")
        if (self.model_files or self.model_mount) and self.model is None:
            raise ValueError("model_files, model_mount: need a pinned model identity in `model`")
        return self

    @property
    def profile_of_engine(self) -> EngineProfile:
        """`engine_profile`, else the profile named like `engine`, else the OpenAI-compatible one."""
        return engine_profile(self.engine_profile or self.engine)

    @property
    def effective_health_path(self) -> str | None:
        return self.health_path if self.health_path is not None else self.profile_of_engine.health_path

    @property
    def model_repo(self) -> str | None:
        return self.model.split("@", 1)[0] if self.model else None

    @property
    def runnable(self) -> bool:
        """True when no value is unknown; only such a recipe may be loaded."""
        return not self.unknown

    def ulimit_tuples(self) -> tuple[tuple[str, int, int], ...]:
        return tuple(
            (name, limit.soft, limit.hard) if isinstance(limit, Ulimit) else (name, limit, limit)
            for name, limit in sorted(self.ulimits.items())
        )


def load_recipe(path: Path) -> Recipe:
    """Read and validate one recipe; RecipeError names the file, the field and the expectation."""
    data = load_toml(path, "recipe", RecipeError)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(path, exc), file=str(path)) from None
    stem = path.name.removesuffix(".toml")
    if recipe.name != stem:
        raise RecipeError(
            f"{path}: name: {recipe.name!r} differs from the file name; expected {stem!r}",
            file=str(path),
            field="name",
        )
    return recipe


def recipe_digest(recipe: Recipe) -> str:
    """SHA-256 of the recipe's canonical JSON; what `io.anvil.recipe-digest` carries.

    Optional fields enter only when set, so that a recipe without them keeps the digest its
    decisions and waivers are bound to (`health_path` "/health" always enters).
    """
    data = recipe.model_dump(mode="json")
    if data.get("health_path") is None and recipe.effective_health_path == "/health":
        data["health_path"] = "/health"
    for optional in (
        "vram_need_mib",
        "source",
        "engine_profile",
        "model_files",
        "model_mount",
        "health_path",
    ):
        if not data.get(optional):
            data.pop(optional, None)
    return sha256_hex(data)
