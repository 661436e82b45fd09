"""The typed arguments of every transaction kind, and their journal form: journaled as JSON when
the transaction begins and rebuilt by `recover` through pydantic, which rejects a row that
does not fit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from pydantic import TypeAdapter

from anvil_ctl.core.identity import Identity
from anvil_ctl.core.jsontypes import JSONMapping, JSONObject
from anvil_ctl.core.model import CUT_AT_DEADLINE, REFUSE_TO_CUT, ContainerSpec, DrainPolicy, ModelFile

if TYPE_CHECKING:
    from anvil_ctl.qualify.runner import Progress

T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """What `load` needs of a recipe, in a form that survives the journal."""

    recipe: str
    recipe_digest: str
    served_model: str
    context_tokens: int
    health_path: str | None
    """None: the engine has no health route; readiness is /v1/models listing the served name."""
    startup_timeout_s: float
    spec: ContainerSpec
    gpu_roles: tuple[str, ...] = ()
    model_identity: str = ""
    max_concurrency: int = 1
    vram_need_mib: int = 0  # per card; the VRAM-release gate waits for this plus the reserve
    engine_profile: str = ""
    model_files: tuple[ModelFile, ...] = ()
    """Files of the model pinned by size and SHA-256, verified before anything stops."""
    drain_timeout_s: float | None = None
    """The recipe's `drain_timeout_s`: how long load waits for the incumbent's answers."""


@dataclass(frozen=True)
class DriftAcceptance:
    """A person's decision to mutate a host that differs from its record."""

    by: str
    reason: str


@dataclass(frozen=True)
class AdoptArgs:
    slot: str
    identity: Identity


@dataclass(frozen=True)
class LoadArgs:
    slot: str
    candidate: Candidate
    incumbent: Identity | None
    incumbent_running: bool
    """Observed before any mutation: compensation restores this, not more."""
    accept_drift: DriftAcceptance | None = None
    drain: DrainPolicy = REFUSE_TO_CUT
    then: PromoteRequest | None = None
    """`load --promote`: the promotion that follows, journaled so `recover` can finish it (`Chain`)."""


@dataclass(frozen=True)
class WatchDeclaration:
    """A promote's watch, resolved before the first sample: how long, how often, its absolute limits."""

    duration_s: float
    interval_s: float
    requests: int
    max_tokens: int
    consecutive: int
    limits: tuple[Mapping[str, object], ...]
    policy: Mapping[str, object]
    """The `[watch]` table it came from (`WatchPolicy.as_dict()`, its profile as `source`)."""
    origin: Mapping[str, object]
    """The decision and profile, and the qualified values relative limits were resolved from."""


@dataclass(frozen=True)
class PromoteArgs:
    slot: str
    candidate: Identity
    incumbent: Identity | None
    decision_id: str | None
    approved_by: str
    accept_drift: DriftAcceptance | None = None
    decision_outcome: str | None = None
    """The standing decision's outcome, read with its ID when the promotion was prepared."""
    watch: WatchDeclaration | None = None
    """None: a cutover, committed after the last step."""
    chain: str | None = None
    """The transaction ID of the `load --promote` whose promotion this is (None: a person's)."""


@dataclass(frozen=True)
class CanaryArgs:
    """`promote --canary`: the loaded candidate beside the tier's incumbent, shares and watch up front."""

    slot: str
    candidate: Identity
    incumbent: Identity
    decision_id: str | None
    decision_outcome: str | None
    approved_by: str
    shares: tuple[int, ...]
    step_watch_s: float
    watch: JSONMapping
    """The `[watch]` policy held at every step (`qualify.canary.policy_to_json`)."""
    profile: str | None
    vram_need_mib: tuple[int | None, int | None] = (None, None)
    """(incumbent, candidate) VRAM need per card from their recipes; None: unknown."""
    drain: DrainPolicy = REFUSE_TO_CUT


@dataclass(frozen=True)
class RollbackArgs:
    slot: str
    target: Identity | None
    current: Identity | None
    """What serves the slot now (stopped and retained), if anything."""
    current_role: str
    current_routed: bool
    restore_group: str | None = None
    restore_group_members: tuple[str, ...] | None = None
    recorded_sha256: str | None = None
    """The newest recorded snapshot in which the target served: what the restore must equal."""
    decided_by: Mapping[str, object] | None = None
    """A rollback no person asked for: the policy that decided it, its evidence, and `undoes`."""
    drain: DrainPolicy = CUT_AT_DEADLINE
    """Rollback is the emergency tool: at its drain's deadline it goes on, counting the cut."""


@dataclass(frozen=True)
class QualifyArgs:
    slot: str
    candidate: Identity | None
    profile: str
    gates: tuple[str, ...] = ()
    recipe: str = ""
    """The candidate's recipe, when it is still the loaded one."""
    engine: str = ""
    """Its recipe's engine kind, recorded in provenance."""
    source: Mapping[str, object] | None = None
    """Its upstream source as published (provenance; external-prior figures)."""
    timeout_s: float | None = None
    """`qualify --timeout`: gates not started by then are recorded as failed (timeout)."""


@dataclass(frozen=True)
class AbArm:
    """One arm of an A/B: the reference the operator gave and the loaded candidate it names."""

    name: str
    identity: Identity


@dataclass(frozen=True)
class AbArgs:
    slot: str
    """The slot whose serving choice the comparison informs."""
    arms: tuple[AbArm, AbArm]
    profile: str


@dataclass(frozen=True)
class UnloadArgs:
    container_id: str
    slot: str
    remove_residue: bool = False
    drain: DrainPolicy = REFUSE_TO_CUT


@dataclass(frozen=True)
class ReconcileArgs:
    slot: str
    serve: Identity
    """The serve the slot's record publishes (its incumbent): what the tier must route to."""


# -- requests: what a command asks for; a kind's `prepare` turns it into its arguments ----------


@dataclass(frozen=True)
class AdoptRequest:
    kind: ClassVar[str] = "adopt"
    slot: str
    container_id: str
    context_tokens: int
    recipe_digest: str = ""
    model_identity: str = ""
    gpu_roles: tuple[str, ...] = ()
    engine: str = ""
    """The serve's engine profile (how it is probed from now on); empty: OpenAI-compatible."""


@dataclass(frozen=True)
class LoadRequest:
    kind: ClassVar[str] = "load"
    slot: str
    candidate: Candidate
    accept_drift: DriftAcceptance | None = None
    drain: DrainPolicy = REFUSE_TO_CUT
    then: PromoteRequest | None = None
    """`load --promote`: the promotion the entry runs once the load commits, under its lock."""


@dataclass(frozen=True)
class PromoteRequest:
    kind: ClassVar[str] = "promote"
    slot: str
    approved_by: str
    candidate: str | None = None
    """Names the slot's loaded candidate (container ID or digest prefix, served model), or None."""
    accept_drift: DriftAcceptance | None = None
    watch_s: float | None = None
    """`--watch`: seconds to watch after the switch (0: a cutover); None: the profile's default."""
    chain: str | None = None
    """The load this promotion finishes; set by the entry, never by a person."""


@dataclass(frozen=True)
class CanaryRequest:
    kind: ClassVar[str] = "canary"
    slot: str
    approved_by: str
    shares: tuple[int, ...]
    step_watch_s: float
    profile: str | None = None
    """The profile whose `[watch]` table judges the steps; None: the candidate's decision's."""
    vram_need_mib: tuple[int | None, int | None] = (None, None)


@dataclass(frozen=True)
class RollbackRequest:
    kind: ClassVar[str] = "rollback"
    slot: str
    to: str | None = None
    """`--to`: a revision number, a transaction, container or identity reference; None: the default."""
    restore_group: str | None = None
    restore_group_members: tuple[str, ...] | None = None
    decided_by: Mapping[str, object] | None = None  # as `RollbackArgs.decided_by`
    drain: DrainPolicy = CUT_AT_DEADLINE


@dataclass(frozen=True)
class QualifyRequest:
    kind: ClassVar[str] = "qualify"
    slot: str
    profile: str | None = None
    gates: tuple[str, ...] = ()
    timeout_s: float | None = None
    recipe_dirs: tuple[Path, ...] = ()
    """Where the candidate's recipe is looked up by name, in order."""
    progress: Progress | None = None
    now: datetime | None = None
    secrets: tuple[str, ...] = ()
    """Router tokens the log audit redacts."""


@dataclass(frozen=True)
class AbRequest:
    kind: ClassVar[str] = "ab"
    slot: str
    arms: tuple[str, str]
    """Each arm's reference: a recipe name, served model or container ID prefix (12+)."""
    profile: str = "ab-control"


@dataclass(frozen=True)
class UnloadRequest:
    kind: ClassVar[str] = "unload"
    container_id: str
    remove_residue: bool = False
    drain: DrainPolicy = REFUSE_TO_CUT


@dataclass(frozen=True)
class ReconcileRequest:
    kind: ClassVar[str] = "reconcile"
    slot: str


Request = (
    AdoptRequest
    | LoadRequest
    | PromoteRequest
    | CanaryRequest
    | RollbackRequest
    | QualifyRequest
    | AbRequest
    | UnloadRequest
    | ReconcileRequest
)


_ADAPTERS: dict[type[object], TypeAdapter[object]] = {}


def _adapter(cls: type[object]) -> TypeAdapter[object]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def to_json(args: object) -> JSONObject:
    """The journal form of a kind's arguments (any dataclass instance; JSON-able)."""
    data: JSONObject = _adapter(type(args)).dump_python(args, mode="json")
    return data


def from_json(cls: type[T], data: JSONMapping) -> T:
    args = _adapter(cls).validate_python(data)
    if not isinstance(args, cls):  # pydantic builds the class it validates against
        raise TypeError(f"expected {cls.__name__}, got {type(args).__name__}")
    return args
