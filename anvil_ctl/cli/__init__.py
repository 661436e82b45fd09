"""The `anvilctl` command line, on click: parse, call a command, render, map errors to exit codes.

Importing it loads click and the light core only: command implementations are imported
inside the callbacks, so `anvilctl --help` is fast (`tests/unit/test_cli_help_imports.py`).
"""

from anvil_ctl.cli.app import console, main

__all__ = ["console", "main"]
