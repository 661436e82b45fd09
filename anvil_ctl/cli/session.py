"""One invocation of `anvilctl`: its global options, its App, and what it answers.

Every command callback takes the `Session` (`@pass_session`), asks it for the `App`
(`anvil_ctl.bootstrap`) when it needs one, and returns a `Reply`: a typed result for the
renderers and the exit code. Nothing here imports a command implementation: `--help` must stay fast,
so this module, like the command modules at import time, loads only click and the core.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

import click

from anvil_ctl.cli.params import PERSON, REASON, Text
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.bootstrap import App
    from anvil_ctl.engine.plans.args import DriftAcceptance

F = TypeVar("F", bound=Callable[..., object])


class OptionDecorator(Protocol):
    """What `click.option(...)` returns: it adds an option to a command callback."""

    def __call__(self, fn: F, /) -> F: ...


@dataclass
class GlobalOptions:
    """The options every command accepts, before or after its name; None: not given (env decides)."""

    config: Path | None = None
    state_db: str | None = None
    state_dir: Path | None = None
    recipes_dir: Path | None = None
    json: bool = False
    output: str | None = None
    """`-o json|table|wide`; json is the same as --json."""
    debug: bool = False

    @property
    def as_json(self) -> bool:
        return self.json or self.output == "json"

    @property
    def wide(self) -> bool:
        """`-o wide`: tables show every column and every ID in full, whatever the width."""
        return self.output == "wide"


@dataclass(frozen=True)
class Reply:
    """What a command answers: a typed result (None: nothing to print) and the exit code."""

    result: object
    code: ExitCode = ExitCode.OK


class Session:
    """The global options of this invocation and its App, opened on first use."""

    def __init__(self, options: GlobalOptions, opener: Callable[[GlobalOptions], App]) -> None:
        self.options = options
        self._opener = opener
        self._app: App | None = None

    def app(self) -> App:
        """The App (settings from flags + env, logging configured), built once."""
        if self._app is None:
            self._app = self._opener(self.options)
        return self._app

    def close(self) -> None:
        """Close the App's adapters; safe to call twice or when none was opened."""
        app, self._app = self._app, None
        if app is not None:
            app.close()


pass_session = click.make_pass_decorator(Session)

OUTPUT_FORMATS = ("table", "wide", "json")


def example(line: str) -> str:
    """A command's help epilog: its one example line (click keeps `\\b` paragraphs unwrapped)."""
    return f"\b\nExample:\n  {line}"


def _remember(click_ctx: click.Context, param: click.Parameter, value: object) -> object:
    """Store a global option given at any level of the command line into the session."""
    session = click_ctx.find_object(Session)
    if session is not None and param.name and value not in (None, False):
        setattr(session.options, param.name, value)
    return value


class _Common(TypedDict):
    expose_value: bool
    callback: Callable[[click.Context, click.Parameter, object], object]


# The global options' types (every click.Path looks its name up through gettext, a
# file-system search, when it is built).
_FILE = click.Path(dir_okay=False, path_type=Path)
_DIR = click.Path(file_okay=False, path_type=Path)
_DB_URL = Text(4096)
_FORMAT = click.Choice(OUTPUT_FORMATS)


@functools.cache
def global_options() -> tuple[click.Parameter, ...]:
    """The global options: one set, built once and shared by every command and group.

    A click parameter holds no per-command state (parsing keeps its values in the
    `click.Context`), so the same seven objects serve all 54 commands and groups: building
    a copy for each cost `--help` ~10 ms (378 options). They are attached to every level of
    the command tree (see `app.attach_global_options`), so `anvilctl --json audit
    transactions` and `anvilctl audit transactions --json` mean the same. Click matches
    long options exactly, never by prefix: `--state` is never taken for `--state-db` or
    `--state-dir`. The environment (`ANVIL_*`, read by Settings) applies where a flag is
    not given.
    """
    common: _Common = {"expose_value": False, "callback": _remember}
    config_help = "Host config file (env ANVIL_CONFIG; default /etc/anvil/anvil.toml as root, else "
    config_help += "~/.config/anvil/anvil.toml)."
    return (
        click.Option(
            ["--config"],
            type=_FILE,
            metavar="FILE",
            help=config_help,
            **common,
        ),
        click.Option(
            ["--state-db"],
            type=_DB_URL,
            metavar="URL",
            help="SQLAlchemy URL of the state database (env ANVIL_STATE_DB).",
            **common,
        ),
        click.Option(
            ["--state-dir"],
            type=_DIR,
            metavar="DIR",
            help="State directory: database, lock, evidence (env ANVIL_STATE_DIR; default "
            "/var/lib/anvil as root, else ~/.local/share/anvil).",
            **common,
        ),
        click.Option(
            ["--recipes-dir"],
            type=_DIR,
            metavar="DIR",
            help="Recipes searched first (env ANVIL_RECIPES_DIR); then the host config's "
            "recipes_dir, then the shipped recipes.",
            **common,
        ),
        click.Option(["--json"], is_flag=True, help="Print the result as one JSON document.", **common),
        click.Option(
            ["-o", "--output"],
            type=_FORMAT,
            metavar="FORMAT",
            help="Output format: table (default), wide (every column and ID in full) or json (= --json).",
            **common,
        ),
        click.Option(["--debug"], is_flag=True, help="Debug logging, and tracebacks on errors.", **common),
    )


def accept_drift_options(fn: F) -> F:
    """`--accept-drift --by NAME --reason TEXT`: a person's decision to mutate a drifted host."""
    fn = click.option(
        "--reason",
        "drift_reason",
        type=REASON,
        metavar="TEXT",
        help="With --accept-drift: why it is safe to go on.",
    )(fn)
    fn = click.option(
        "--by",
        "drift_by",
        type=PERSON,
        metavar="NAME",
        help="With --accept-drift: the person accepting the drift.",
    )(fn)
    return click.option(
        "--accept-drift",
        is_flag=True,
        help="Go on although the slot differs from its record (recorded with --by and --reason).",
    )(fn)


def drift_acceptance(accept: bool, by: str | None, reason: str | None) -> DriftAcceptance | None:
    """The journaled DriftAcceptance, or None; both --by and --reason are required with it."""
    if not accept:
        if by or reason:
            raise click.UsageError("--by and --reason go with --accept-drift")
        return None
    if not (by and by.strip()) or not (reason and reason.strip()):
        raise click.UsageError("--accept-drift needs --by NAME and --reason TEXT")
    from anvil_ctl.engine.plans.args import DriftAcceptance

    return DriftAcceptance(by=by.strip(), reason=reason.strip())


def timeout_option(what: str) -> OptionDecorator:
    """`--timeout DURATION` of load, promote, rollback and qualify (kubectl and helm spelling)."""
    from anvil_ctl.cli.params import TIMEOUT

    return click.option("--timeout", "timeout_s", type=TIMEOUT, metavar="DURATION", help=what)


WAIT_TIMEOUT_HELP = (
    "Longest any one wait may last (health, VRAM release, readmission), e.g. 90s, 5m; default: "
    "the recipe's and the host config's deadlines. Compensation keeps those, never this."
)
