"""The `anvilctl` command line: parse, call a command, render, map errors to exit codes.

Exit codes (the README documents them): 0 ok; 1 internal error; 2 bad input or
usage; 3 refused before mutation; 4 failed and compensated back to the before
state; 5 needs an operator; 6 recheck found drift.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from anvil_ctl.config import Settings
from anvil_ctl.core.errors import AnvilError, BadInput, ConfigError

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT = 0, 1, 2


class UsageError(BadInput):
    """The command line itself is wrong."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 itself; keep our one-line form
        raise UsageError(f"{self.prog}: {message}")


Handler = Callable[[argparse.Namespace, Any], tuple[Any, int]]


def _json_default(o: Any) -> Any:
    if hasattr(o, "as_dict"):
        return o.as_dict()
    return str(o)


def render(result: Any, as_json: bool) -> None:
    if result is None:
        return
    payload = result.as_dict() if hasattr(result, "as_dict") else result
    if as_json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=_json_default))
        return
    from anvil_ctl import render as human

    human.show(payload)


def build_parser() -> argparse.ArgumentParser:
    from anvil_ctl import cli_commands

    p = _Parser(prog="anvilctl", description="Transactional deployment controller with exact rollback")
    p.add_argument("--config", type=Path, help="host config file (default anvil.toml, env ANVIL_CONFIG)")
    p.add_argument("--state-db", help="SQLAlchemy URL of the state database (env ANVIL_STATE_DB)")
    p.add_argument("--state-dir", type=Path, help="state directory (env ANVIL_STATE_DIR)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cli_commands.register(sub)
    return p


GLOBAL_FLAGS = {"--json": 0, "--debug": 0, "--config": 1, "--state-db": 1, "--state-dir": 1}


def hoist_globals(argv: Sequence[str]) -> list[str]:
    """Let global options appear anywhere (`anvilctl audit transactions --json`)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in GLOBAL_FLAGS and arg != "--":
            n = 0 if "=" in arg else GLOBAL_FLAGS[name]
            front.extend(argv[i : i + 1 + n])
            i += 1 + n
            continue
        if arg == "--":
            rest.extend(argv[i:])
            break
        rest.append(arg)
        i += 1
    return front + rest


def settings_from(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    overrides: dict[str, Any] = {}
    if args.config is not None:
        overrides["config"] = args.config
    if args.state_db is not None:
        overrides["state_db"] = args.state_db
    if args.state_dir is not None:
        overrides["state_dir"] = args.state_dir
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"ANVIL_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"settings: {problems}") from None


def main(argv: Sequence[str] | None = None) -> int:
    from anvil_ctl import log
    from anvil_ctl.bootstrap import Context

    argv = hoist_globals(list(argv if argv is not None else sys.argv[1:]))
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        settings = settings_from(args, dict(os.environ))
        log.configure(settings.log_format, "debug" if args.debug else settings.log_level)
        ctx = Context(settings=settings, env=dict(os.environ))
        try:
            result, code = args.handler(args, ctx)
        finally:
            ctx.close()
        render(result, args.json)
        return int(code)
    except AnvilError as exc:
        if debug:
            raise
        print(f"anvilctl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("anvilctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(
            f"anvilctl: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
