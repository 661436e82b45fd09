"""Run one `load` on a FakeHost in a child process; exit with the CLI's code for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from anvil_ctl.commands import transactions
from anvil_ctl.core.errors import AnvilError
from anvil_ctl.log import configure
from tests.unit.fakehost import reopen


def main() -> int:
    configure("json")
    host = reopen(Path(sys.argv[1]), state_db=os.environ.get("ANVIL_STATE_DB"))
    try:
        out = transactions.load(host.app(), slot="primary", candidate=host.candidate(name=sys.argv[2]))
    except AnvilError as exc:
        print(f"anvilctl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(out.state.value)
    return out.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
