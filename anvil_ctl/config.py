"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge (the CLI) and passed in; no library module reads
the environment itself. Validation errors name the file, the key and what was
expected.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from anvil_ctl.core.errors import ConfigError

GPU_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class Settings(BaseSettings):
    """Process settings, from the environment (prefix ANVIL_) or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="ANVIL_", extra="ignore")

    state_dir: Path = Field(Path("state"), description="Directory for the database, lock and evidence")
    state_db: str | None = Field(
        None,
        description="SQLAlchemy URL of the state database; default sqlite:///<state_dir>/anvil.db",
    )
    config: Path = Field(Path("anvil.toml"), description="Path of the host config file")
    recipes_dir: Path = Field(Path("recipes"), description="Directory of recipe TOML files")
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a TTY, JSON lines otherwise"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level")
    backend: Literal["real", "fake"] = Field(
        "real",
        description="real: Docker, NVML, HTTP routers; fake: the simulated host of anvil_ctl.testing",
    )
    fake_world: Path | None = Field(
        None,
        description="JSON file holding the fake backend's world; default <state_dir>/fake-world.json",
    )
    gpu: Literal["nvml", "simulated"] = Field(
        "nvml",
        description="nvml: real GPUs; simulated: GPUs declared in the host config, driven by stubs",
    )
    docker_host: str | None = Field(None, description="Docker Engine URL; default from DOCKER_HOST")
    crash_at: str | None = Field(
        None,
        description="Fault injection for tests and `make chaos` only: SIGKILL this process right after "
        "the journal row KIND:STEP:PHASE:EVENT (or KIND:state:STATE; * matches anything) commits",
    )
    pause_at: str | None = Field(
        None,
        description="Fault injection for tests and `make chaos` only: at this journal boundary, write it "
        "into <state_dir>/paused-at and wait until that file is removed",
    )

    @property
    def db_url(self) -> str:
        return self.state_db or f"sqlite:///{(self.state_dir / 'anvil.db').resolve()}"

    @property
    def lock_path(self) -> Path:
        return self.state_dir / "anvil.lock"

    @property
    def pause_file(self) -> Path:
        return self.state_dir / "paused-at"

    @property
    def evidence_dir(self) -> Path:
        return self.state_dir / "evidence"

    @property
    def fake_world_path(self) -> Path:
        return self.fake_world or self.state_dir / "fake-world.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuRole(_Strict):
    """A named GPU, pinned by UUID, never by index."""

    uuid: str = Field(description="NVML UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    capacity_mib: int = Field(gt=0, description="Total memory of the card in MiB")
    reserve_mib: int | None = Field(
        None, ge=0, description="Free MiB to keep after a workload; default policy.vram_reserve_mib"
    )
    name: str = Field("", description="Product name, informational")

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, value: str) -> str:
        if not GPU_UUID_RE.match(value):
            raise ValueError("expected a GPU UUID like GPU-0123abcd-0123-0123-0123-0123456789ab")
        return value


class Slot(_Strict):
    """A serving position: loopback binding, router tier, client aliases, GPU roles."""

    binding: str = Field(description="host:port the engine listens on, loopback by default")
    router_tier: str = Field(description="The router tier (backend group) this slot serves")
    aliases: tuple[str, ...] = Field(description="Client model aliases routed to this slot")
    gpu_roles: tuple[str, ...] = Field(default=(), description="GPU roles serves in this slot may use")
    allow_public_bind: bool = Field(False, description="Permit a non-loopback binding")

    @property
    def host(self) -> str:
        return self.binding.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.binding.rsplit(":", 1)[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.binding}"

    @model_validator(mode="after")
    def _binding(self) -> Slot:
        host, sep, port = self.binding.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"binding {self.binding!r}: expected HOST:PORT")
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback and not self.allow_public_bind:
            raise ValueError(
                f"binding {self.binding!r} is not loopback; set allow_public_bind = true to permit it"
            )
        if not self.aliases:
            raise ValueError("aliases: expected at least one client alias")
        return self


class RouterConfig(_Strict):
    """How to reach the router and where its credentials come from (never the tokens themselves)."""

    kind: Literal["smg", "haproxy", "none"] = Field("smg", description="Router implementation")
    url: str = Field("http://127.0.0.1:30000", description="Router data-plane URL (clients)")
    admin_url: str | None = Field(None, description="Control-plane URL; default url")
    admin_token_env: str = Field("ANVIL_ROUTER_ADMIN_TOKEN", description="Env var of the admin token")
    client_token_env: str = Field("ANVIL_ROUTER_CLIENT_TOKEN", description="Env var of the client token")
    credential_file: Path | None = Field(
        None, description="TOML file with admin_token/client_token; owner-only (0600)"
    )
    runtime_socket: Path | None = Field(None, description="HAProxy Runtime API socket")
    backend: str | None = Field(None, description="HAProxy backend name for the tiers")
    readmit_deadline_s: float = Field(90.0, gt=0, description="How long readmission may take")
    removal_hold_s: float = Field(
        6.0,
        ge=0,
        description=(
            "smg: how long a readmitted registration must stay listed, admitted and routed, "
            "counted from the start of readmission (and from the sighting of any removal pending "
            "for it), before readmission ends. smg 1.13 removes a DELETEd worker after a fixed "
            "5 s drain, by URL, whatever is registered at that URL by then (measured 5.10-5.15 s); "
            "keep this above that delay. 0 turns the hold off"
        ),
    )


class Policy(_Strict):
    vram_reserve_mib: int = Field(3072, ge=0, description="Free MiB per card required after a workload")
    vram_release_deadline_s: float = Field(120.0, gt=0, description="Wait for VRAM to be freed")
    stop_timeout_s: float = Field(30.0, gt=0, description="Grace before a stopped container is killed")
    health_poll_s: float = Field(
        0.5,
        gt=0,
        description=(
            "Longest interval between health (and VRAM-release) probes: polls start at 0.05 s "
            "and grow by a quarter each up to it"
        ),
    )


# The names the engines we serve give their files in /dev/shm. A file matching one is
# ours once no process holds it, even if anvilctl never saw a managed container hold it.
ENGINE_SEGMENTS: tuple[str, ...] = (
    # NCCL: ncclShmOpen (src/misc/shmutils.cc) creates "/dev/shm/nccl-XXXXXX" with
    # mkstemp for the SHM transport, proxy op pools and NVLS buffers.
    "nccl-*",
    # PyTorch: at::NewProcessWideShmHandle (aten/src/ATen/MapAllocator.cpp) names
    # shm_open segments "/torch_<pid>_<random>_<n>": the file_system sharing strategy
    # of torch.multiprocessing and the CUDA IPC ref-counter files.
    "torch_*",
    # Python multiprocessing.shared_memory: _SHM_NAME_PREFIX "/psm_" (CPython
    # Lib/multiprocessing/shared_memory.py). vLLM's ShmRingBuffer/MessageQueue
    # (vllm/distributed/device_communicators/shm_broadcast.py), its shm object
    # storage and tensor arena, and SGLang's copy of shm_broadcast all create these.
    "psm_*",
    # SGLang names its own /dev/shm files "sglang_*": the HiCache host memory pool's
    # `alloc_shm` falls back to "/dev/shm/sglang_host_pool_<hex>.mmap" where
    # memfd_create is unavailable (unlinked right after creation, so only a kill in
    # between leaves one). SGLang's other segments are psm_*, nccl-* and torch_*.
    "sglang_*",
)


class ResidueConfig(_Strict):
    """[residue]: which files in the shared-memory directory are residue of managed engines.

    Ours: a file a process of a managed container (label io.anvil.managed=true) was
    seen holding, or a file whose name matches `include`; never a file matching
    `exclude`, and never one held right now by a process outside managed containers.
    Residue: a file of ours that no process holds any more.
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


class HostConfig(_Strict):
    """anvil.toml: the host's GPU roles, slots, router and policy."""

    host: str = Field("localhost", description="Name of this host in records")
    gpu_roles: dict[str, GpuRole] = Field(default_factory=dict, description="role name -> GPU")
    slots: dict[str, Slot] = Field(default_factory=dict, description="slot name -> slot")
    router: RouterConfig = Field(default_factory=RouterConfig)
    policy: Policy = Field(default_factory=Policy)
    residue: ResidueConfig = Field(
        default_factory=ResidueConfig, description="Which shared-memory files count as our residue"
    )
    model_cache_dir: Path | None = Field(
        None, description="Hugging Face hub cache (…/hub) that engines mount; checked before load"
    )
    restore_groups: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="name -> container IDs or identity digests (prefixes of 12+ hex) restored together",
    )

    @model_validator(mode="after")
    def _references(self) -> HostConfig:
        for name in [*self.gpu_roles, *self.slots]:
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


def format_validation_error(path: Path, exc: ValidationError) -> str:
    """One line per problem: file, dotted key, what was expected."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{path}: {key}: {err['msg']}")
    return "; ".join(lines)


def load_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", file=str(path)) from None


def load_host_config(path: Path) -> HostConfig:
    data = load_toml(path, "host config")
    try:
        return HostConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc), file=str(path)) from None
