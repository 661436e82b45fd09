"""The `anvilctl` command line, on click: parse, call a command, render, map errors to exit codes.

Modules, one concept each: `app` (the root group and its one command table, global
options, `main`, the exit-code mapping), `session` (global options, the command
context, `Reply`), `admin`, `serves`, `lifecycle`, `qualify`, `gpu`, `audit` (the
commands), `complete` (shell completion), `views` (typed wrappers of plain results)
and `render` (human and JSON output by result type).

Importing this package loads click and the light core only: command
implementations are imported inside the callbacks, so `anvilctl --help` is fast
(`tests/unit/test_cli_help_imports.py` holds it).
"""

from anvil_ctl.cli.app import console, main

__all__ = ["console", "main"]
