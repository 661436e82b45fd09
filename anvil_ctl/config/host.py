"""The host config file (anvil.toml): GPU roles, slots, router, policy and residue globs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from anvil_ctl.config.fields import (
    GPU_UUID_RE,
    NAME_RE,
    Duration,
    EnvName,
    FilePath,
    HttpUrl,
    Label,
    MiB,
    Strict,
    text_field,
    valid_if,
)
from anvil_ctl.config.inputs import format_validation_error, load_toml
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.validate import MAX_MIB, is_loopback, split_binding


class GpuRole(Strict):
    """A named GPU, pinned by UUID, never by index."""

    uuid: Annotated[
        str, valid_if(GPU_UUID_RE.match, "expected a GPU UUID like GPU-0123abcd-0123-0123-0123-0123456789ab")
    ] = Field(description="NVML UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    capacity_mib: int = Field(gt=0, le=MAX_MIB, description="Total memory of the card in MiB")
    reserve_mib: MiB | None = Field(
        None, description="Free MiB to keep after a workload; default policy.vram_reserve_mib"
    )
    name: Label = Field("", description="Product name, informational")


class Slot(Strict):
    """A serving position: loopback binding, router tier, client aliases, GPU roles."""

    binding: str = Field(description="host:port ([IPv6]:port) the engine listens on, loopback by default")
    router_tier: Label = Field(description="The router tier (backend group) this slot serves")
    aliases: tuple[Annotated[str, text_field(253, empty=False)], ...] = Field(
        max_length=64, description="Client model aliases routed to this slot"
    )
    gpu_roles: tuple[str, ...] = Field(
        default=(), max_length=64, description="GPU roles serves in this slot may use"
    )
    allow_public_bind: bool = Field(False, description="Permit a non-loopback binding")

    @property
    def host(self) -> str:
        """The binding's host, without the brackets of an IPv6 address."""
        return split_binding(self.binding)[0]

    @property
    def port(self) -> int:
        return split_binding(self.binding)[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.binding}"

    @model_validator(mode="after")
    def _binding(self) -> Slot:
        try:
            host, _ = split_binding(self.binding)
        except ValueError as exc:
            raise ValueError(f"binding {exc}") from None
        if not is_loopback(host) and not self.allow_public_bind:
            raise ValueError(
                f"binding {self.binding!r} is not loopback; set allow_public_bind = true to permit it"
            )
        if not self.aliases:
            raise ValueError("aliases: expected at least one client alias")
        return self


class RouterConfig(Strict):
    """How to reach the router and where its credentials come from (never the tokens themselves)."""

    kind: Literal["smg", "haproxy", "none"] = Field("smg", description="Router implementation")
    url: HttpUrl = Field("http://127.0.0.1:30000", description="Router data-plane URL (clients)")
    admin_url: HttpUrl | None = Field(None, description="Control-plane URL; default url")
    admin_token_env: EnvName = Field("ANVIL_ROUTER_ADMIN_TOKEN", description="Env var of the admin token")
    client_token_env: EnvName = Field("ANVIL_ROUTER_CLIENT_TOKEN", description="Env var of the client token")
    credential_file: FilePath | None = Field(
        None, description="TOML file with admin_token/client_token; owner-only (0600)"
    )
    metrics_url: HttpUrl | None = Field(
        None,
        description=(
            "smg: its Prometheus page (`smg --prometheus-host 127.0.0.1 --prometheus-port 29000`: "
            "http://127.0.0.1:29000/metrics), where each worker's failed answers are counted "
            "(`router_errors` in a watch). Unset: that count is recorded absent and never judged"
        ),
    )
    runtime_socket: FilePath | None = Field(None, description="HAProxy Runtime API socket")
    backend: Label | None = Field(None, description="HAProxy backend name for the tiers")
    readmit_deadline_s: Duration = Field(90.0, description="How long readmission may take")
    drain_deadline_s: Duration = Field(
        30.0, description="How long taking a backend out of the router (drain, removal) may take"
    )
    removal_hold_s: float = Field(
        6.0,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description=(
            "smg: how long a readmitted registration must stay listed, admitted and routed, "
            "counted from the start of readmission (and from the sighting of any removal pending "
            "for it), before readmission ends. smg 1.13 removes a DELETEd worker after a fixed "
            "drain, by URL, whatever is registered at that URL by then; keep this above that "
            "drain. 0 turns the hold off"
        ),
    )

    @model_validator(mode="after")
    def _metrics_for_smg(self) -> RouterConfig:
        if self.metrics_url is not None and self.kind != "smg":
            raise ValueError(f"metrics_url: smg's alone; kind {self.kind!r} keeps its own counts")
        return self


class Policy(Strict):
    vram_reserve_mib: MiB = Field(3072, description="Free MiB per card required after a workload")
    vram_release_deadline_s: Duration = Field(120.0, description="Wait for VRAM to be freed")
    stop_timeout_s: Duration = Field(30.0, description="Grace before a stopped container is killed")
    health_poll_s: Duration = Field(
        0.5,
        description=(
            "Longest interval between health (and VRAM-release) probes: polls start short "
            "and grow by a quarter each up to it"
        ),
    )


# The names the engines we serve give their files in /dev/shm. A file matching one is
# ours once no process holds it, even if anvilctl never saw a managed container hold it.
ENGINE_SEGMENTS: tuple[str, ...] = (
    "nccl-*",  # NCCL's ncclShmOpen: SHM transport, proxy op pools, NVLS buffers
    "torch_*",  # PyTorch's shm_open segments (torch.multiprocessing, CUDA IPC ref-counters)
    "psm_*",  # multiprocessing.shared_memory: vLLM's and SGLang's shm_broadcast and arenas
    "sglang_*",  # SGLang's HiCache host pool where memfd_create is unavailable
)


class ResidueConfig(Strict):
    """[residue]: which files in the shared-memory directory are residue of managed engines.

    Ours: a file a managed container's process was seen holding, or one matching `include`;
    never one matching `exclude` or held now by another process. Residue: ours and unheld.
    """

    directory: Path = Field(
        Path("/dev/shm"),  # noqa: S108 - scanned, never written to
        description="Shared-memory directory to scan (the host's, which ipc=host engines share)",
    )
    include: tuple[str, ...] = Field(
        ENGINE_SEGMENTS,
        description=(
            "Globs of the engines' known segment names (matched against the name and the path "
            "relative to the directory); default NCCL nccl-*, PyTorch torch_*, Python "
            "multiprocessing psm_* (vLLM, SGLang), SGLang sglang_*"
        ),
    )
    exclude: tuple[str, ...] = Field(
        (),
        description=(
            "Globs that are never residue; they win over include and over files seen held "
            "by managed containers"
        ),
    )


class HostConfig(Strict):
    """anvil.toml: the host's GPU roles, slots, router and policy."""

    host: str = Field(
        "",
        description='This host\'s name in the records and the fleet: `[host] name = "gpu-a"` '
        "(or `host = \"gpu-a\"`); lowercase letters, digits, '.', '_' or '-', up to 63; default: "
        "the machine's hostname (its first label, lowercased)",
    )
    gpu_roles: dict[str, GpuRole] = Field(default_factory=dict, description="role name -> GPU")
    slots: dict[str, Slot] = Field(default_factory=dict, description="slot name -> slot")
    router: RouterConfig = Field(default_factory=RouterConfig)
    policy: Policy = Field(default_factory=Policy)
    residue: ResidueConfig = Field(
        default_factory=ResidueConfig, description="Which shared-memory files count as our residue"
    )
    model_cache_dir: FilePath | None = Field(
        None, description="Hugging Face hub cache (…/hub) that engines mount; checked before load"
    )
    recipes_dir: FilePath | None = Field(
        None,
        description="This host's recipes: searched after --recipes-dir / ANVIL_RECIPES_DIR and "
        "before the recipes shipped with anvilctl; relative to this file's directory",
    )
    restore_groups: dict[str, tuple[Annotated[str, text_field(128, empty=False)], ...]] = Field(
        default_factory=dict,
        description="name -> container IDs or identity digests (prefixes of 12+ hex) restored together",
    )

    @field_validator("host", mode="before")
    @classmethod
    def _host(cls, value: object) -> object:
        if isinstance(value, dict):  # the [host] table
            extra = sorted(set(value) - {"name"})
            if extra:
                raise ValueError(f"[host]: unknown key {extra[0]!r}; expected name")
            value = value.get("name", "")
        if isinstance(value, str) and not NAME_RE.match(value):  # given, so not empty
            raise ValueError(
                f"host name {value!r}: expected a short name: lowercase letters, digits, '.', '_' "
                "or '-', starting with a letter or digit, up to 63 characters"
            )
        return value

    @model_validator(mode="after")
    def _references(self) -> HostConfig:
        for name in [*self.gpu_roles, *self.slots, *self.restore_groups]:
            if not NAME_RE.match(name):
                raise ValueError(f"name {name!r}: expected lowercase letters, digits, '.', '_' or '-'")
        uuids = [r.uuid.lower() for r in self.gpu_roles.values()]
        if len(set(uuids)) != len(uuids):
            raise ValueError("gpu_roles: two roles name the same GPU UUID")
        for slot_name, slot in self.slots.items():
            for role in slot.gpu_roles:
                if role not in self.gpu_roles:
                    raise ValueError(
                        f"slots.{slot_name}.gpu_roles: unknown role {role!r}; "
                        f"expected one of {sorted(self.gpu_roles)}"
                    )
        bindings = [s.binding for s in self.slots.values()]
        if len(set(bindings)) != len(bindings):
            raise ValueError("slots: two slots share one binding")
        return self

    def slot(self, name: str) -> Slot:
        try:
            return self.slots[name]
        except KeyError:
            raise ConfigError(
                f"slot {name!r} is not in the host config; expected one of {sorted(self.slots)}",
                field="slot",
            ) from None

    def reserve_for(self, role: str) -> int:
        r = self.gpu_roles[role].reserve_mib
        return self.policy.vram_reserve_mib if r is None else r


def machine_host_name(hostname: str) -> str:
    """The machine's hostname's first label, lowercased, for a config without `host`; else ConfigError."""
    name = hostname.split(".", 1)[0].lower()
    if not NAME_RE.match(name):
        raise ConfigError(
            f"the machine's hostname {hostname!r} is not a valid host name; set [host] name in anvil.toml",
            field="host",
        )
    return name


def load_host_config(path: Path) -> HostConfig:
    data = load_toml(path, "host config")
    try:
        config = HostConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc), file=str(path)) from None
    if config.recipes_dir is not None and not config.recipes_dir.is_absolute():
        # Relative to the file that names it, never to the current directory.
        config = config.model_copy(update={"recipes_dir": path.parent / config.recipes_dir})
    return config
