"""The `anvilctl` root: the one command table, global options, and the one exit-code mapping.

Every error becomes one line on stderr here and nowhere else: usage 2, an `AnvilError` its
own `exit_code`, anything else 1 (a bug; `--debug` for the traceback), Ctrl-C 130.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

import click

from anvil_ctl.cli import admin, audit, gpus_and_waivers, lifecycle, qualify, serves
from anvil_ctl.cli.complete import PROG, completion
from anvil_ctl.cli.session import GlobalOptions, Reply, Session, example, global_options
from anvil_ctl.cli.topics import help_command
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.core.states import ExitCode
from anvil_ctl.core.validate import escape_text

INTERRUPTED = 128 + signal.SIGINT  # the shell's convention for a process ended by Ctrl-C: 130

COMMANDS: list[click.Command] = [
    # administration
    admin.init,
    admin.db,
    admin.status,
    admin.recover,
    admin.resolve,
    admin.lock,
    # serves
    serves.recipes,
    serves.load,
    serves.unload,
    serves.adopt,
    # lifecycle
    qualify.qualify,
    qualify.evidence,
    lifecycle.promote,
    lifecycle.rollback,
    lifecycle.restore,
    lifecycle.recheck,
    lifecycle.reconcile,
    # GPUs and waivers
    gpus_and_waivers.gpus,
    gpus_and_waivers.waive,
    gpus_and_waivers.waivers,
    # records
    audit.audit,
    admin.fleet,
    qualify.claims,
    completion,
    help_command,
]
"""Every top-level command and group, in one place; nothing registers itself on import."""


def _print_version(click_ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not click_ctx.resilient_parsing:
        from importlib.metadata import PackageNotFoundError, version

        try:
            click.echo(f"{PROG} {version('anvil-ctl')}")
        except PackageNotFoundError:  # running from a source tree that was never installed
            click.echo(f"{PROG} unknown")
        click_ctx.exit(ExitCode.OK)


root = click.Group(
    PROG,
    commands=COMMANDS,
    help="Transactional deployment controller with exact rollback for local LLM-serving hosts.",
    epilog=example("anvilctl --state-dir /var/lib/anvil audit transactions --kind load --json"),
    params=[
        click.Option(
            ["--version"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_print_version,
            help="Print the version of anvilctl and exit.",
        )
    ],
)


def attach_global_options(command: click.Command) -> None:
    """Give `command` and every command below it the global options, except where one has its own."""
    taken = {opt for p in command.params for opt in getattr(p, "opts", ())}
    command.params.extend(o for o in global_options() if not taken & set(getattr(o, "opts", ())))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach_global_options(sub)


attach_global_options(root)


def _error(message: str) -> None:
    """One line on stderr, with control and bidi characters and newlines shown as escapes."""
    print(f"{PROG}: error: {escape_text(message)}", file=sys.stderr)


def _usage_message(exc: click.UsageError) -> str:
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        message = "missing command"
    else:
        message = " ".join(exc.format_message().split())  # one line, whatever click wrapped
    path = exc.ctx.command_path if exc.ctx is not None else PROG
    return f"{message} (see `{path} --help`)"


def _masked(text: str, options: GlobalOptions) -> str:
    """`text` with the state database's password (as given, and decoded) as ***."""
    from urllib.parse import unquote, urlsplit

    for url in (options.state_db, os.environ.get("ANVIL_STATE_DB")):
        try:
            password = urlsplit(url).password if url else None
        except ValueError:
            continue
        for form in {password, unquote(password)} if password else ():
            text = text.replace(form, "***")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run `anvilctl` with `argv` (default: sys.argv[1:]); return the exit code."""
    options = GlobalOptions()
    session = Session(options)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            reply = root.main(args=args, prog_name=PROG, standalone_mode=False, obj=session)
        finally:
            session.close()
        if not isinstance(reply, Reply):  # --help, --version: click printed and returned a code
            return int(reply or ExitCode.OK)
        from anvil_ctl.cli import render

        try:
            render.show(reply.result, options.as_json, wide=options.wide)
        except BrokenPipeError:
            # The reader left (`anvilctl audit show TX | head`): the work is done and recorded,
            # so its exit code stands; stdout goes nowhere so that the exit flush cannot fail.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(reply.code)
    except click.UsageError as exc:
        _error(_usage_message(exc))
        return int(ExitCode.BAD_INPUT)
    except click.ClickException as exc:
        _error(" ".join(exc.format_message().split()))
        return int(ExitCode.BAD_INPUT)
    except AnvilError as exc:
        if options.debug:
            # the traceback for a person debugging, and still our exit code (a wrong database
            # password exits 7 with --debug too); no password appears in it
            print(_masked(traceback.format_exc(), options), file=sys.stderr, end="")
        _error(str(exc))
        return int(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        print(f"{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        if options.debug:
            raise
        _error(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
        return int(ExitCode.INTERNAL)


def console() -> NoReturn:
    """`anvilctl`: run `main`, flush, and `os._exit` without the interpreter's slow teardown."""
    # No cyclic GC for the first STARTING_S seconds of imports; then on, with those frozen out.
    gc.disable()
    timer = threading.Timer(STARTING_S, _collector_on)
    timer.daemon = True
    timer.start()
    _without_httpx_cli()
    code = main()
    for stream in (sys.stdout, sys.stderr):
        # The reader may have left (`anvilctl ... | head`): nothing more to say to it.
        with contextlib.suppress(BrokenPipeError, ValueError):
            stream.flush()
    os._exit(code)


def _without_httpx_cli() -> None:
    """Keep `import httpx` from importing its own CLI client (rich, pygments, click) that anvilctl
    never runs: a `None` in `sys.modules` makes that one import fail (encode/httpx#3547)."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


STARTING_S = 2.0
"""How long a process of `anvilctl` runs without the cyclic garbage collector (see `console`)."""


def _collector_on() -> None:
    gc.freeze()
    gc.enable()
