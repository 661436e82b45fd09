"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge (the CLI) and passed in; no library module reads
the environment itself. Validation errors name the file, the key and what was
expected. Every value is checked here, before anything runs: integers are
bounded, durations finite, URLs of a known scheme, text free of control and
bidi characters (`anvil_ctl.core.validate`). Files given by a person (this host
config, recipes, profiles, credential files) are read by `read_input_file`:
bytes, decoded as UTF-8, refused by name when they are a directory, a FIFO, a
symlink loop, too large or nested too deeply.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from anvil_ctl.core.errors import AnvilError, ConfigError
from anvil_ctl.core.validate import (
    MAX_DURATION_S,
    MAX_MIB,
    check_text,
    check_url,
    describe_char,
    is_loopback,
    split_binding,
    unsafe_char,
)
from anvil_ctl.places import DefaultPaths, process_defaults

GPU_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
STATE_DB_RE = re.compile(r"^(sqlite|postgresql)(\+[a-z0-9_]+)?://")

MAX_INPUT_BYTES = 1 << 20
"""Host configs, recipes and profiles are a few KiB; a larger file is a mistake."""

MAX_NESTING = 16
"""Arrays and tables nest at most this deep in our TOML files (ours use 3)."""


# -- reading files a person gave us ------------------------------------------------------------


def read_input_file(
    path: Path,
    what: str,
    *,
    max_bytes: int = MAX_INPUT_BYTES,
    error: Callable[..., AnvilError] = ConfigError,
) -> str:
    """The text of a regular file, decoded as UTF-8; `error` names the file and the problem.

    A directory, FIFO, socket or device, a symlink loop, a file over `max_bytes` or one
    that is not UTF-8 is refused before (or instead of) being parsed. Reading opens
    with O_NONBLOCK so that a FIFO swapped in after the check cannot hang us.
    """
    noun = what if what.endswith("file") else f"{what} file"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found", file=str(path)) from None
    except (OSError, ValueError) as exc:  # ELOOP, EACCES, ENOTDIR, ENAMETOOLONG; NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(f"{path}: {what} cannot be read: {reason}", file=str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory; expected a {noun}", file=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise error(
            f"{path}: is not a regular file (a FIFO, socket or device); expected a {noun}", file=str(path)
        )
    if st.st_size > max_bytes:
        raise error(f"{path}: {st.st_size} bytes; expected a {noun} of at most {max_bytes}", file=str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: {what} cannot be read: {exc.strerror or exc}", file=str(path)) from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than {max_bytes} bytes; expected a {noun}", file=str(path))
    return decode_utf8(data, path, noun, error)


def decode_utf8(data: bytes, path: Path, what: str, error: Callable[..., AnvilError] = ConfigError) -> str:
    """`data` as UTF-8 text (a leading BOM dropped); `error` names the first bad byte."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise error(f"{path}: is UTF-16; expected a UTF-8 {what}", file=str(path))
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            f"expected a UTF-8 {what}",
            file=str(path),
        ) from None


def parse_toml(
    text: str, path: Path, what: str, error: Callable[..., AnvilError] = ConfigError
) -> dict[str, Any]:
    """TOML text as a dict; `error` for a syntax error or arrays/tables nested too deeply."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}", file=str(path)) from None
    except RecursionError:
        raise error(
            f"{path}: nested more than {MAX_NESTING} levels deep; expected a {what}", file=str(path)
        ) from None
    if _depth(data) > MAX_NESTING:
        raise error(f"{path}: nested more than {MAX_NESTING} levels deep; expected a {what}", file=str(path))
    return data


def _depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (iteratively: no recursion limit to hit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        deepest = max(deepest, level if isinstance(item, dict | list) else level - 1)
        todo.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


# -- field types -------------------------------------------------------------------------------


def _text(max_len: int, *, multiline: bool = False, empty: bool = True) -> AfterValidator:
    return AfterValidator(lambda v: check_text(v, max_len=max_len, multiline=multiline, empty=empty))


def _path_text(value: Any) -> Any:
    """A path as given: no NUL or control characters (they cannot name a file we mean)."""
    if isinstance(value, str | Path):
        text = str(value)
        if not text:
            raise ValueError("expected a path, not an empty string")
        bad = unsafe_char(text)
        if bad is not None:
            raise ValueError(f"contains {describe_char(bad)}; expected a path")
        if len(text) > 4096:
            raise ValueError("expected a path of at most 4096 characters")
    return value


def _url(*schemes: str) -> AfterValidator:
    return AfterValidator(lambda v: check_url(v, schemes=schemes))


def _env_name(value: str) -> str:
    if not ENV_NAME_RE.match(value):
        raise ValueError("expected an environment variable name (letters, digits, '_')")
    return value


Label = Annotated[str, _text(253)]
"""A one-line name or label from a file: host name, product name, alias, tier."""
FilePath = Annotated[Path, BeforeValidator(_path_text)]
Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
MiB = Annotated[int, Field(ge=0, le=MAX_MIB)]
HttpUrl = Annotated[str, _url("http", "https")]


class Settings(BaseSettings):
    """Process settings, from the environment (prefix ANVIL_) or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="ANVIL_", extra="ignore")

    state_dir: FilePath = Field(
        default_factory=lambda: process_defaults().state_dir,
        description="Directory for the database, lock and evidence; default /var/lib/anvil as "
        "root, else $XDG_DATA_HOME/anvil (~/.local/share/anvil)",
    )
    state_db: str | None = Field(
        None,
        description="SQLAlchemy URL of the state database; default sqlite:///<state_dir>/anvil.db",
    )
    config: FilePath = Field(
        default_factory=lambda: process_defaults().config,
        description="Path of the host config file; default /etc/anvil/anvil.toml as root, else "
        "$XDG_CONFIG_HOME/anvil/anvil.toml (~/.config/anvil/anvil.toml)",
    )
    recipes_dir: FilePath | None = Field(
        None,
        description="Directory of recipe TOML files, searched first; then the host config's "
        "recipes_dir, then the recipes shipped with anvilctl",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a TTY, JSON lines otherwise"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level (on a terminal, where progress is shown: warning unless set)"
    )
    progress_heartbeat_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Progress on a pipe: a 'still ...' line after this many quiet seconds in a "
        "step; 0 turns it off",
    )
    backend: Literal["real", "fake"] = Field(
        "real",
        description="real: Docker, NVML, HTTP routers; fake: the simulated host of anvil_ctl.testing",
    )
    fake_world: FilePath | None = Field(
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

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory; expected a state directory")
        return value

    @field_validator("state_db")
    @classmethod
    def _state_db(cls, value: str | None) -> str | None:
        if value is None:
            return None
        bad = unsafe_char(value)
        if bad is not None or not STATE_DB_RE.match(value):
            raise ValueError("expected a database URL: sqlite:///PATH or postgresql://USER@HOST/DB")
        return value

    @field_validator("docker_host")
    @classmethod
    def _docker_host(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, schemes=("unix", "tcp", "http", "https", "ssh"))

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
    capacity_mib: int = Field(gt=0, le=MAX_MIB, description="Total memory of the card in MiB")
    reserve_mib: MiB | None = Field(
        None, description="Free MiB to keep after a workload; default policy.vram_reserve_mib"
    )
    name: Label = Field("", description="Product name, informational")

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, value: str) -> str:
        if not GPU_UUID_RE.match(value):
            raise ValueError("expected a GPU UUID like GPU-0123abcd-0123-0123-0123-0123456789ab")
        return value


class Slot(_Strict):
    """A serving position: loopback binding, router tier, client aliases, GPU roles."""

    binding: str = Field(description="host:port ([IPv6]:port) the engine listens on, loopback by default")
    router_tier: Label = Field(description="The router tier (backend group) this slot serves")
    aliases: tuple[Annotated[str, _text(253, empty=False)], ...] = Field(
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


class RouterConfig(_Strict):
    """How to reach the router and where its credentials come from (never the tokens themselves)."""

    kind: Literal["smg", "haproxy", "none"] = Field("smg", description="Router implementation")
    url: HttpUrl = Field("http://127.0.0.1:30000", description="Router data-plane URL (clients)")
    admin_url: HttpUrl | None = Field(None, description="Control-plane URL; default url")
    admin_token_env: Annotated[str, AfterValidator(_env_name)] = Field(
        "ANVIL_ROUTER_ADMIN_TOKEN", description="Env var of the admin token"
    )
    client_token_env: Annotated[str, AfterValidator(_env_name)] = Field(
        "ANVIL_ROUTER_CLIENT_TOKEN", description="Env var of the client token"
    )
    credential_file: FilePath | None = Field(
        None, description="TOML file with admin_token/client_token; owner-only (0600)"
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
            "5 s drain, by URL, whatever is registered at that URL by then (measured 5.10-5.15 s); "
            "keep this above that delay. 0 turns the hold off"
        ),
    )


class Policy(_Strict):
    vram_reserve_mib: MiB = Field(3072, description="Free MiB per card required after a workload")
    vram_release_deadline_s: Duration = Field(120.0, description="Wait for VRAM to be freed")
    stop_timeout_s: Duration = Field(30.0, description="Grace before a stopped container is killed")
    health_poll_s: Duration = Field(
        0.5,
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

    host: Annotated[str, _text(253, empty=False)] = Field(
        "localhost", description="Name of this host in records"
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
    restore_groups: dict[str, tuple[Annotated[str, _text(128, empty=False)], ...]] = Field(
        default_factory=dict,
        description="name -> container IDs or identity digests (prefixes of 12+ hex) restored together",
    )

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


def format_validation_error(path: Path, exc: ValidationError) -> str:
    """One line per problem: file, dotted key, what was expected."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{path}: {key}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def load_toml(path: Path, what: str, error: Callable[..., AnvilError] = ConfigError) -> dict[str, Any]:
    """A TOML file a person gave us, read by `read_input_file`; `error` names every problem."""
    return parse_toml(read_input_file(path, what, error=error), path, what, error)


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


SETTING_VARIABLES = {
    "state_dir": "ANVIL_STATE_DIR",
    "state_db": "ANVIL_STATE_DB",
    "config": "ANVIL_CONFIG",
    "recipes_dir": "ANVIL_RECIPES_DIR",
}


def setting_origins(
    flags: Mapping[str, object], env: Mapping[str, str], defaults: DefaultPaths
) -> dict[str, str]:
    """Where each path setting came from: its flag (`--state-dir`), its variable
    (`ANVIL_STATE_DIR`), or the default (`default (root)`, `default (XDG)`); `status` and
    `init` print it beside the path."""
    upper = {k.upper() for k, v in env.items() if v}
    out: dict[str, str] = {}
    for name, variable in SETTING_VARIABLES.items():
        if flags.get(name) is not None:
            out[name] = "--" + name.replace("_", "-")
        elif variable in upper:
            out[name] = variable
        elif name in ("state_dir", "config"):
            out[name] = f"default ({defaults.why})"
        elif name == "state_db":
            out[name] = "default (<state dir>/anvil.db)"
        else:
            out[name] = "not set"
    return out
