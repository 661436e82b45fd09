"""The one exception tree of anvil_ctl.

AnvilError
├── BadInput                     exit 2: a file, field or argument is not what was expected
│   ├── ConfigError              the host config (anvil.toml) or settings
│   └── RecipeError              a recipe file
├── Refused                      exit 3: rejected before the first mutation, nothing changed
│   ├── LockHeld                 another mutator owns this host
│   └── AuthRejected             the router refused our credentials (401/403)
├── NeedsOperator                exit 5: a step found the host must not be touched further
├── AdapterError                 a port's implementation failed (translated at the edge)
│   ├── Unavailable              exit 7: a dependency is busy, locked, read-only, full or unreachable
│   │   └── TransientError       worth retrying (connection reset, 5xx, API busy)
│   ├── NotFound                 the object named by an exact ID does not exist
│   └── CredentialError          a token could not be resolved or its file is unsafe
├── StepFailed                   raised by a step's do/undo to fail with a reason
│   └── DrainRefused             exit 3: answers in flight at its deadline; compensated, still routed
├── StateStoreError              the state database is missing, foreign or too new
├── EvidenceMismatch             exit 6: an evidence bundle differs from its manifest
├── RecordDiffers                exit 6: a record to be used (copied) does not verify
├── HostClaimed                  exit 8: another machine is recorded under this host's name
└── TargetHoldsHost              exit 9: `db copy` found this host's rows in the target
IllegalTransition (RuntimeError) misuse: a transition the table does not allow (core.states)
UncoveredRows (RuntimeError)     misuse: history rows committed without their audit entry (persistence)
"""

from __future__ import annotations

from anvil_ctl.core.states import ExitCode


class AnvilError(Exception):
    """Base of every error anvil_ctl raises on purpose."""

    exit_code: int = ExitCode.INTERNAL

    def __init__(self, message: str, **data: object) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class BadInput(AnvilError):
    """Input (file, field, argument) is not what was expected; nothing was changed."""

    exit_code = ExitCode.BAD_INPUT


class ConfigError(BadInput):
    """The host config or settings are invalid."""


class RecipeError(BadInput):
    """A recipe file is invalid."""


class Refused(AnvilError):
    """The transaction was rejected before its first mutation; nothing changed."""

    exit_code = ExitCode.REFUSED


class LockHeld(Refused):
    """Another process holds the host's mutator lock."""


class AuthRejected(Refused):
    """The router answered 401/403 to our credentials: a configuration error, not a model one."""


class NeedsOperator(AnvilError):
    """Compensation failed or the transaction was interrupted; a person must look."""

    exit_code = ExitCode.NEEDS_OPERATOR


class AdapterError(AnvilError):
    """An adapter failed to do or observe something."""


class Unavailable(AdapterError):
    """A dependency is busy, locked, read-only, full or unreachable (`dependency`); retry may work."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, message: str, *, dependency: str = "", **data: object) -> None:
        super().__init__(message, dependency=dependency, **data)
        self.dependency = dependency


class TransientError(Unavailable):
    """A failure worth retrying: connection refused or reset, 5xx, a busy API."""


class NotFound(AdapterError):
    """The object named by an exact ID does not exist."""


class CredentialError(AdapterError):
    """A credential could not be resolved, or its file is unsafe."""

    exit_code = ExitCode.REFUSED


class StepFailed(AnvilError):
    """A step's do or undo could not reach its goal."""


class DrainRefused(StepFailed):
    """A drain's deadline passed with answers in flight and the policy refuses to cut them."""

    exit_code = ExitCode.REFUSED


class StateStoreError(AnvilError):
    """The state database is missing, at an unknown revision, or newer than this program."""

    exit_code = ExitCode.BAD_INPUT


class EvidenceMismatch(AnvilError):
    """An evidence bundle differs from its manifest: nothing is read from it as a figure."""

    exit_code = ExitCode.DRIFT


class HostClaimed(AnvilError):
    """The configured host name is recorded for another machine: two machines cannot be one host."""

    exit_code = ExitCode.HOST_CLAIMED


class TargetHoldsHost(AnvilError):
    """`db copy`: the target database already holds rows of this host; nothing was written."""

    exit_code = ExitCode.TARGET_HOLDS_HOST


class RecordDiffers(AnvilError):
    """The audit chain of a record to be used (a `db copy`'s source or copy) does not verify."""

    exit_code = ExitCode.DRIFT
