"""The `anvilctl` command line, on click; `--help` loads click and the light core only."""

from anvil_ctl.cli.app import console, main

__all__ = ["console", "main"]
