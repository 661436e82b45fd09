"""Ports: what the core needs from the world, as Protocols (adapters implement, testing fakes them).

Every implementation translates its library's exceptions into `anvil_ctl.core.errors`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from anvil_ctl.core.jsontypes import JSONObject
from anvil_ctl.core.model import (
    CacheReport,
    ContainerInfo,
    ContainerLog,
    ContainerSpec,
    GpuReading,
    ImageInfo,
    ModelCard,
    ModelFile,
    PromptAnswer,
    Readmission,
    ResidueFile,
    ResidueRemoval,
    RouteCheck,
    RoutedAnswer,
    ShmMark,
)
from anvil_ctl.core.states import TxState


class ContainerRuntime(Protocol):
    """Create, start, stop, inspect and remove containers by exact ID."""

    def inspect(self, container_id: str) -> ContainerInfo:
        """Observe one container; raise NotFound if it does not exist."""

    def list(self, *, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        """All containers (running or not), optionally filtered by labels."""

    def image(self, ref: str) -> ImageInfo:
        """Observe an image by ID, digest reference or tag; raise NotFound if absent."""

    def create(self, spec: ContainerSpec) -> str:
        """Create (do not start) a container; return its ID."""

    def start(self, container_id: str) -> None: ...

    def stop(self, container_id: str, timeout_s: float) -> None:
        """Stop and wait until the runtime reports it exited (bounded by timeout_s plus a kill)."""

    def remove(self, container_id: str) -> None: ...

    def logs(
        self, container_id: str, *, max_lines: int, max_bytes: int, since: float | None = None
    ) -> ContainerLog:
        """The newest lines (bounded) of stdout and stderr since creation (or since the Unix
        time `since`), restarts, OOM; or NotFound."""


@runtime_checkable
class Router(Protocol):
    """The authenticated router in front of the engines; tiers map client aliases to backends."""

    def probe_credentials(self) -> None:
        """A harmless authenticated admin and client call; raise AuthRejected on 401/403."""

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None: ...

    def deregister(self, tier: str, url: str) -> None: ...

    def drain(self, tier: str, *, hold_s: float = 0.0) -> None:
        """Quiesce the tier: no new admissions (a retryable 503 until `readmit`); requests in flight
        go on. `hold_s`: a router that can hold a new request until this process's next `readmit`
        of the tier (and send it there) holds it that long at most, else answers it 503."""

    def in_flight(self, tier: str, url: str) -> int | None:
        """The router's own count of requests in flight to `url` (None: it has no count for it)."""

    def errors(self, tier: str, url: str) -> int | None:
        """The router's own count of failed answers from `url` since it started (5xx, failed
        connections, aborted responses), read passively; None where it keeps none we can read."""

    def readmit(self, r: Readmission) -> None:
        """(Re-)register the backend; return once a routed request answers 200 from the expected
        model and the registration holds against a removal still pending. StepFailed at the deadline."""

    def routed_chat(self, alias: str) -> RoutedAnswer:
        """One authenticated routed chat completion to an alias."""

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        """Whether `tier` routes to `url` now: sole admitted registration, not draining, no removal
        pending, and a routed chat answering from expected_model. Only 401/403 raises."""

    def ready(self) -> bool: ...

    def view(self, tier: str) -> JSONObject:
        """The tier for snapshots (no secrets): `router`, `tier`, `ready`, and its `backends`."""


@runtime_checkable
class WeightedRouter(Protocol):
    """A router that can split one tier's new requests between backends by weight (HAProxy's
    server weights); smg's selection policies have no per-worker weight: a canary there is refused."""

    def set_weights(self, tier: str, weights: Mapping[str, int]) -> None:
        """Backend URL -> weight 0-100 for new requests of `tier`; each URL must already be
        registered in the tier. Requests in flight are not moved."""


@runtime_checkable
class GpuProbe(Protocol):
    """NVML readings by GPU UUID."""

    def gpus(self) -> list[GpuReading]: ...

    def driver_version(self) -> str: ...


class ServerProbe(Protocol):
    """The engine's OpenAI-compatible endpoint, for health and served identity."""

    def health(self, base_url: str, path: str) -> bool: ...

    def models(self, base_url: str) -> list[ModelCard]: ...

    def listening(self, base_url: str) -> bool:
        """Whether anything accepts connections at the URL's host and port (any server)."""

    def probe_prompt(self, base_url: str, model: str, words: int) -> PromptAnswer:
        """One chat of `words` one-token words, max_tokens 1: the context-refusal probe."""

    def running(self, base_url: str, metric: str) -> int | None:
        """The engine's Prometheus gauge `metric` summed over labels; None when it publishes none."""


@runtime_checkable
class SharedMemory(Protocol):
    """Shared-memory and offload residue left by managed engines (never another program's files)."""

    def residue(self) -> list[ResidueFile]:
        """Files of ours that no process holds any more."""

    def remove_unheld(self) -> ResidueRemoval:
        """Delete residue only when two observations agree that no process holds it."""


@runtime_checkable
class ShmLedger(Protocol):
    """Durable, append-only memory of the shared-memory files managed containers held."""

    def marks(self, boot_id: str) -> list[ShmMark]:
        """Every mark recorded during the boot `boot_id`."""

    def remember(self, marks: list[ShmMark]) -> None:
        """Record marks not recorded yet (a mark already known is not written again)."""


class ModelCache(Protocol):
    """The on-disk model cache (Hugging Face layout) that engines load from."""

    def verify_identity(self, identity: str) -> CacheReport:
        """Check `repo@revision`: snapshot present, no incomplete blobs, no broken links."""

    def verify_files(self, identity: str, files: Sequence[ModelFile]) -> CacheReport:
        """`verify_identity`, and each pinned file's size and SHA-256 (and GGUF header)."""


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class Owner:
    """The process that owns a transaction or the host lock."""

    pid: int
    hostname: str
    boot_id: str


@dataclass(frozen=True)
class TxRecord:
    id: str
    kind: str
    slot: str | None
    args: JSONObject
    owner: Owner
    state: TxState
    created_at: str


@dataclass(frozen=True)
class StepEvent:
    seq: int
    step: str
    phase: str
    event: str
    detail: JSONObject
    at: str


class Progress:
    """What a person watching a transaction is told; every method returns at once (never blocks)."""

    def transaction(self, tx_id: str, kind: str, slot: str | None, steps: int) -> None:
        """A transaction of `steps` steps began running (its guards passed)."""

    def step_started(self, seq: int, name: str, phase: str, description: str) -> None:
        """A step began: phase `do`, `undo` (compensation) or `check` (the guards, seq -1)."""

    def step_finished(
        self, seq: int, name: str, phase: str, *, ok: bool, elapsed_s: float, error: str
    ) -> None:
        """The step that began last ended, after `elapsed_s`; `error` says why when not `ok`."""

    def waiting(self, what: str, deadline_s: float) -> None:
        """The running step waits for `what` at most `deadline_s` seconds."""

    def activity(self, text: str) -> None:
        """What the running step does now, in a few words (replaced by the next one)."""

    def note(self, text: str) -> None:
        """A line worth keeping (a gate's verdict, a route re-applied)."""

    def finished(self, state: str, reason: str, elapsed_s: float) -> None:
        """The transaction reached its end state."""


class SilentProgress(Progress):
    """Progress that tells nobody: library callers, tests, `--json`."""
