"""The `anvilctl` command line, on click; command implementations are imported inside the callbacks,
so `--help` loads click and the light core only.
"""

from anvil_ctl.cli.app import console, main

__all__ = ["console", "main"]
