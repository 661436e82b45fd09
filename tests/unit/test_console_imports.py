"""The console entry point keeps httpx's own command line client out of the process.

`import httpx` imports `httpx._main` (rich, pygments, click) whenever those are installed, as
they are with anvilctl; `cli.app.console` blocks that one module before any command imports
httpx. A library caller's `import httpx` (no console) stays as httpx makes it: the control
below shows the check sees the difference on this very install."""

from __future__ import annotations

import json
import subprocess
import sys

CONSOLE = """
import json, sys
from anvil_ctl.cli import app
def command(argv=None):
    import httpx
    print(json.dumps({"loaded": sorted({"rich", "pygments"} & set(sys.modules)),
                      "cli": "httpx._main" in sys.modules and sys.modules["httpx._main"] is not None,
                      "client": hasattr(httpx, "Client")}), flush=True)
    return 0
app.main = command
app.console()
"""

PLAIN = """
import json, sys
import httpx
print(json.dumps({"loaded": sorted({"rich", "pygments"} & set(sys.modules))}), flush=True)
"""


def _report(code: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    report: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return report


def test_a_command_that_imports_httpx_under_the_console_loads_no_rich_or_pygments() -> None:
    assert _report(CONSOLE) == {"loaded": [], "cli": False, "client": True}


def test_without_the_console_httpx_brings_them_on_this_install() -> None:
    assert _report(PLAIN)["loaded"] == ["pygments", "rich"]
