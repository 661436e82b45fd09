"""`python3 -m anvil_stub [options]`: run the stub engine until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from anvil_stub.server import main

if __name__ == "__main__":
    sys.exit(main())
