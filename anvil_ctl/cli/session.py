"""One invocation of `anvilctl`: its global options, its App, and what it answers (a `Reply`).

Loads only click and the core: `--help` must stay fast.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, Never, ParamSpec, TypedDict

import click

from anvil_ctl.cli.params import text
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.bootstrap import App
    from anvil_ctl.config.settings import Settings

P = ParamSpec("P")


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

    def __init__(self, options: GlobalOptions) -> None:
        self.options = options
        self._app: App | None = None

    def app(self) -> App:
        """The App (settings from flags + env, logging configured), built once."""
        if self._app is None:
            self._app = open_app(self.options)
        return self._app

    @contextlib.contextmanager
    def working(self, what: str) -> Iterator[App]:
        """The App, with `what` on a terminal's live line while the command does it."""
        from anvil_ctl.cli.progress import working

        app = self.app()
        with working(app.progress, what):
            yield app

    def close(self) -> None:
        """Close the App's adapters; safe to call twice or when none was opened."""
        app, self._app = self._app, None
        if app is not None:
            app.close()


pass_session = click.make_pass_decorator(Session)


class Lazy:
    """A module imported at the first use of one of its attributes: a command's library (heavy)
    loads when the command runs, never for `--help`. Import it under TYPE_CHECKING too, for its types."""

    def __init__(self, module: str) -> None:
        self._lazy_module = module

    def __getattr__(self, attr: str) -> object:
        return getattr(importlib.import_module(self._lazy_module), attr)


OUTPUT_FORMATS = ("table", "wide", "json")


def example(line: str) -> str:
    """A command's help epilog: its one example line (click keeps `\\b` paragraphs unwrapped)."""
    return f"\b\nExample:\n  {line}"


def command(
    name: str, example_line: str, *, help: str | None = None, short_help: str | None = None
) -> Callable[[Callable[Concatenate[Session, P], Reply | None]], click.Command]:
    """A command that takes this invocation's Session, with its one example line."""

    def make(fn: Callable[Concatenate[Session, P], Reply | None]) -> click.Command:
        epilog = example(example_line)
        return click.command(name, help=help, short_help=short_help, epilog=epilog)(pass_session(fn))

    return make


def group(name: str, help: str, example_line: str, *commands: click.Command) -> click.Group:
    """A command group with its help and its one example line."""
    return click.Group(name, commands=list(commands), help=help, epilog=example(example_line))


def _remember(click_ctx: click.Context, param: click.Parameter, value: object) -> object:
    """Store a global option given at any level of the command line into the session."""
    session = click_ctx.find_object(Session)
    if session is not None and param.name and value not in (None, False):
        setattr(session.options, param.name, value)
    return value


# The global options' types (every click.Path looks its name up through gettext, a
# file-system search, when it is built).
_FILE = click.Path(dir_okay=False, path_type=Path)
_DIR = click.Path(file_okay=False, path_type=Path)
_DB_URL = text(4096)
_FORMAT = click.Choice(OUTPUT_FORMATS)


def _global(
    flags: list[str], help: str, kind: click.ParamType[object, Never] | None = None, metavar: str = ""
) -> click.Option:
    """A global option, stored into the session by `_remember`; without a `kind`, a flag."""
    return click.Option(
        flags,
        type=kind,
        metavar=metavar or None,
        is_flag=kind is None,
        help=help,
        expose_value=False,
        callback=_remember,
    )


@functools.cache
def global_options() -> tuple[click.Parameter, ...]:
    """The global options: one set of click parameters, built once and attached to every level of
    the command tree, so `anvilctl --json audit transactions` and `... transactions --json` mean
    the same. The environment (`ANVIL_*`) applies where a flag is not given.
    """
    config_help = "Host config file (env ANVIL_CONFIG; default /etc/anvil/anvil.toml as root, else "
    config_help += "~/.config/anvil/anvil.toml)."
    return (
        _global(["--config"], config_help, _FILE, "FILE"),
        _global(["--state-db"], "SQLAlchemy URL of the state database (env ANVIL_STATE_DB).", _DB_URL, "URL"),
        _global(
            ["--state-dir"],
            "State directory: database, lock, evidence (env ANVIL_STATE_DIR; default "
            "/var/lib/anvil as root, else ~/.local/share/anvil).",
            _DIR,
            "DIR",
        ),
        _global(
            ["--recipes-dir"],
            "Recipes searched first (env ANVIL_RECIPES_DIR); then the host config's "
            "recipes_dir, then the shipped recipes.",
            _DIR,
            "DIR",
        ),
        _global(["--json"], "Print the result as one JSON document."),
        _global(
            ["-o", "--output"],
            "Output format: table (default), wide (every column and ID in full) or json (= --json).",
            _FORMAT,
            "FORMAT",
        ),
        _global(["--debug"], "Debug logging, and tracebacks on errors."),
    )


class _Overrides(TypedDict, total=False):
    """The path settings a flag gave (a flag not given leaves its setting to the environment)."""

    config: Path
    state_db: str
    state_dir: Path
    recipes_dir: Path


def settings_from(options: GlobalOptions) -> Settings:
    """Settings from the environment (ANVIL_*), overridden by the flags that were given."""
    from pydantic import ValidationError

    from anvil_ctl.config.settings import Settings

    overrides: _Overrides = {}
    if options.config is not None:
        overrides["config"] = options.config
    if options.state_db is not None:
        overrides["state_db"] = options.state_db
    if options.state_dir is not None:
        overrides["state_dir"] = options.state_dir
    if options.recipes_dir is not None:
        overrides["recipes_dir"] = options.recipes_dir
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_setting_name(e['loc'], overrides)}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ConfigError(problems) from None


def _setting_name(loc: tuple[int | str, ...], flags: Mapping[str, object]) -> str:
    """The flag that gave a setting (`--state-db`), else its variable (`ANVIL_STATE_DB`)."""
    name = "_".join(str(p) for p in loc)
    if name in flags:
        return "--" + name.replace("_", "-")
    return f"ANVIL_{name.upper()}"


def open_app(options: GlobalOptions) -> App:
    """The one place the App is built; on a terminal the log level is `warning` unless told otherwise."""
    from anvil_ctl import log
    from anvil_ctl.bootstrap import App
    from anvil_ctl.cli.progress import for_stream
    from anvil_ctl.config.settings import setting_origins
    from anvil_ctl.places import process_defaults

    settings = settings_from(options)
    env = dict(os.environ)
    level: str = settings.log_level
    if options.debug:
        level = "debug"
    elif sys.stderr.isatty() and not options.as_json and "ANVIL_LOG_LEVEL" not in env:
        level = "warning"
    log.configure(settings.log_format, level)
    flags = {"config": options.config, "state_db": options.state_db, "state_dir": options.state_dir}
    flags["recipes_dir"] = options.recipes_dir
    return App(
        settings=settings,
        env=env,
        origins=setting_origins(flags, env, process_defaults()),
        progress=for_stream(
            sys.stderr, json_output=options.as_json, heartbeat_s=settings.progress_heartbeat_s
        ),
        keep_connection=True,  # the session closes the App when the command ends
    )
