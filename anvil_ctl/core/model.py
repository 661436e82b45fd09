"""Value objects the core and its ports exchange: frozen, comparable, hashable, never a secret."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from anvil_ctl.core.digest import sha256_hex
from anvil_ctl.core.jsontypes import JSONObject

ContainerStatus = Literal["created", "running", "paused", "restarting", "exited", "dead", "removing"]

LABEL_PREFIX = "io.anvil."
LABEL_MANAGED = LABEL_PREFIX + "managed"
LABEL_SLOT = LABEL_PREFIX + "slot"
LABEL_RECIPE = LABEL_PREFIX + "recipe"
LABEL_RECIPE_DIGEST = LABEL_PREFIX + "recipe-digest"
LABEL_TX = LABEL_PREFIX + "transaction"
LABEL_ROLE = LABEL_PREFIX + "role"
LABEL_SERVED_MODEL = LABEL_PREFIX + "served-model"


def hub_repo_folder(repo_id: str) -> str:
    """`org/name` -> `models--org--name`, the Hugging Face hub cache's folder of a model repository."""
    return "models--" + repo_id.replace("/", "--")


@dataclass(frozen=True)
class ModelFile:
    """One file of a pinned model, by its path in the snapshot, its SHA-256 and its size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class CacheReport:
    """What the model cache holds for one pinned model; `complete` only when `problems` is empty."""

    repo_id: str
    revision: str
    snapshot_path: str
    complete: bool
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerSpec:
    """Exactly what `load` creates; the fingerprint of a running container is taken of the same fields."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    network_mode: str = "host"
    ports: tuple[tuple[int, str], ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    shm_size: str | None = None
    ipc_mode: str | None = None
    ulimits: tuple[tuple[str, int, int], ...] = ()
    init: bool = True

    def fingerprint_fields(self) -> dict[str, object]:
        return fingerprint_fields(
            image=self.image,
            command=list(self.command),
            entrypoint=list(self.entrypoint) if self.entrypoint is not None else None,
            env=dict(self.env),
            mounts=[asdict(m) for m in self.mounts],
            ports=[list(p) for p in self.ports],
            gpu_uuids=list(self.gpu_uuids),
            shm_size=self.shm_size,
            ipc_mode=self.ipc_mode,
            ulimits=[list(u) for u in self.ulimits],
            network_mode=self.network_mode,
        )


def fingerprint_fields(
    *,
    image: str,
    command: list[str],
    entrypoint: list[str] | None,
    env: dict[str, str],
    mounts: Sequence[Mapping[str, str | bool]],
    ports: list[list[int | str]],
    gpu_uuids: list[str],
    shm_size: str | int | None,
    ipc_mode: str | None,
    ulimits: list[list[str | int]],
    network_mode: str,
) -> dict[str, object]:
    """The normalized fields a config fingerprint covers; env values enter only as a hash."""
    return {
        "image": image,
        "command": command,
        "entrypoint": entrypoint,
        "env_sha256": sha256_hex(sorted(env.items())),
        "env_keys": sorted(env),
        "mounts": sorted(mounts, key=lambda m: (m["target"], m["source"])),
        "ports": sorted(ports),
        "gpu_uuids": sorted(gpu_uuids),
        "shm_size": str(shm_size) if shm_size is not None else None,
        "ipc_mode": ipc_mode or None,
        "ulimits": sorted(ulimits),
        "network_mode": network_mode,
    }


def config_fingerprint(fields: Mapping[str, object]) -> str:
    return sha256_hex(fields)


@dataclass(frozen=True)
class ContainerInfo:
    """What the runtime observed of one container, by exact ID."""

    id: str
    name: str
    image_id: str
    image_ref: str
    status: ContainerStatus
    labels: dict[str, str] = field(default_factory=dict)
    fingerprint: str = ""
    repo_digests: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    exit_code: int | None = None
    pid: int | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def managed(self) -> bool:
        return self.labels.get(LABEL_MANAGED) == "true"


@dataclass(frozen=True)
class ContainerLog:
    """A container's newest log lines (bounded by `max_lines`/`max_bytes`), restarts and OOM flag."""

    lines: tuple[str, ...]
    bytes_read: int
    truncated: bool
    max_lines: int
    max_bytes: int
    restart_count: int = 0
    oom_killed: bool = False
    status: str = ""
    started_at: str = ""
    exit_code: int | None = None

    @classmethod
    def bounded(cls, tail: bytes, *, max_lines: int, max_bytes: int, cut: bool = False) -> ContainerLog:
        """The log from the raw `tail` of a container's output, cut to the caps (the runtime's
        observations, such as restarts and status, are set by the caller with `replace`).

        `tail` may hold one line more than `max_lines` (how an adapter learns there were older
        lines); `cut`: the adapter already dropped bytes from its front.
        """
        data = tail
        if len(data) > max_bytes:
            data, cut = data[len(data) - max_bytes :], True
        lines = data.decode("utf-8", errors="replace").splitlines()
        if cut and lines:
            lines = lines[1:]  # the first line was cut in the middle
        if len(lines) > max_lines:
            lines, cut = lines[len(lines) - max_lines :], True
        return cls(tuple(lines), len(data), cut, max_lines, max_bytes)


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    name: str
    index: int
    total_mib: int
    used_mib: int
    free_mib: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class ModelCard:
    id: str
    max_model_len: int | None = None


@dataclass(frozen=True)
class PromptAnswer:
    """How an engine answered one probe prompt: its status and an excerpt of the body."""

    status: int
    body: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Backend:
    """One backend of a router tier, as the router reports it."""

    url: str
    healthy: bool
    models: tuple[str, ...] = ()
    state: str = "ready"
    backend_id: str | None = None


@dataclass(frozen=True)
class RoutedAnswer:
    status: int
    model: str | None
    content: str | None = None


@dataclass(frozen=True)
class Readmission:
    """Route `tier` (back) to the backend at `url` for `aliases` (`Router.readmit`): done once a
    routed chat answers 200 from `expected_model`, StepFailed past `deadline_s`. `hold`: hold as if
    a removal were pending, for removals the router adapter never saw."""

    tier: str
    url: str
    aliases: tuple[str, ...]
    expected_model: str
    deadline_s: float
    hold: bool = False


@dataclass(frozen=True)
class RouteCheck:
    """Whether a router tier routes to one backend now (see `Router.check_route`) and, if not, why."""

    tier: str
    url: str
    expected_model: str
    holds: bool
    reason: str = ""
    """Empty when it holds; otherwise the first thing observed to be wrong."""

    def __bool__(self) -> bool:
        return self.holds

    def as_dict(self) -> JSONObject:
        return asdict(self)


@dataclass(frozen=True)
class ResidueFile:
    """A shared-memory file a managed engine left behind (see `anvil_ctl.adapters.shm`)."""

    path: str
    size: int
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShmMark:
    """A shared-memory file seen held by a managed container, by path and inode within one boot."""

    path: str
    dev: int
    ino: int
    container_id: str
    boot_id: str


@dataclass(frozen=True)
class VramNeed:
    """What the VRAM-release gate waits for: these roles' cards with need + reserve free."""

    roles: tuple[str, ...]
    need_mib: int = 0
    """Per card; 0 when the serve declares none (the reserve alone must be free)."""
    recipe_digest: str = ""
    """Selects recipe-scoped waivers of the reserve."""


@dataclass(frozen=True)
class ResidueRemoval:
    """What a residue removal deleted, and what it kept with the reason."""

    removed: tuple[str, ...] = ()
    kept: tuple[tuple[str, str], ...] = ()


DEFAULT_DRAIN_TIMEOUT_S = 300.0
"""A drain's deadline when neither recipe nor command sets one: a 100K-token prefill and a long answer."""

OnDrainTimeout = Literal["abort", "cut"]


@dataclass(frozen=True)
class DrainPolicy:
    """How a step that takes a serve out of traffic waits for the answers in flight."""

    deadline_s: float = DEFAULT_DRAIN_TIMEOUT_S
    on_timeout: OnDrainTimeout = "abort"
    """At the deadline: `abort` compensates (the serve stays routed); `cut` stops it, counting cut answers."""

    @classmethod
    def of(
        cls, deadline_s: float | None, on_timeout: OnDrainTimeout | None, *, default: OnDrainTimeout
    ) -> DrainPolicy:
        """The command's choices (None: not given) over the defaults."""
        return cls(deadline_s or DEFAULT_DRAIN_TIMEOUT_S, on_timeout or default)


REFUSE_TO_CUT = DrainPolicy()
"""Planned changes (load, unload): at the deadline, give up and leave the serve routed."""
CUT_AT_DEADLINE = DrainPolicy(on_timeout="cut")
"""The emergency tool (rollback): at the deadline, go on and count the answers cut."""
