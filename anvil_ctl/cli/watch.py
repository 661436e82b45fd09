"""`status --watch`: observe again until Ctrl-C (or --count), as `kubectl get -w` does."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from anvil_ctl.cli.output import Out, s
from anvil_ctl.cli.session import Session
from anvil_ctl.core.errors import Unavailable

if TYPE_CHECKING:
    from anvil_ctl.cli.views import StatusView

CLEAR = "\x1b[H\x1b[2J"


def watch_status(session: Session, *, interval_s: float, count: int | None) -> None:
    from anvil_ctl.cli import render
    from anvil_ctl.cli.views import StatusView
    from anvil_ctl.commands import admin

    app = session.app()
    as_json = session.options.as_json
    terminal = sys.stdout.isatty() and not as_json
    seen = 0
    try:
        while count is None or seen < count:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            try:
                view: StatusView | None = StatusView(admin.status(app))
                problem = ""
            except Unavailable as exc:
                view, problem = None, str(exc)
            if as_json:
                data = view.payload() if view else {"observed_at": stamp, "unavailable": problem}
                print(json.dumps(data, sort_keys=True, default=str), flush=True)
            else:
                if terminal:
                    print(CLEAR, end="")
                    print(f"every {interval_s:g} s, Ctrl-C to stop; {stamp}\n")
                else:
                    print(f"--- {stamp}")
                if view is not None:
                    render.show(
                        view, False, wide=session.options.wide, out=Out.stdout(wide=session.options.wide)
                    )
                else:
                    print(f"UNAVAILABLE: {s(problem)}")
                sys.stdout.flush()
            seen += 1
            if count is None or seen < count:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        if not as_json:
            print()
