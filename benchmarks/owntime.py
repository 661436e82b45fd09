"""Run `anvilctl` and note how long it waited on Docker and HTTP calls (benchmarks only).

    python benchmarks/owntime.py OUT.json status --slot primary

Wraps `requests.Session.send` (the Docker SDK) and `httpx.Client.send` (router, engine
probes) to add up the wall time spent inside them, runs the console entry point, and
writes `{"io_s": ..., "calls": ...}` to OUT.json right before the process exits. The
parent times the whole process; its own time is that wall time minus `io_s`. Both
libraries are imported up front: a status on a real host imports them anyway, and
their import time stays in the process's own time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx
import requests

spent = {"io_s": 0.0, "calls": 0}


def timed(send: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return send(*args, **kwargs)
        finally:
            spent["io_s"] += time.perf_counter() - started
            spent["calls"] += 1

    return wrapper


def main() -> None:
    out, sys.argv = sys.argv[1], ["anvilctl", *sys.argv[2:]]
    requests.Session.send = timed(requests.Session.send)  # type: ignore[method-assign]
    httpx.Client.send = timed(httpx.Client.send)  # type: ignore[method-assign]
    real_exit = os._exit

    def exit_noting(code: int) -> None:
        with open(out, "w") as fh:
            json.dump(spent, fh)
        real_exit(code)

    os._exit = exit_noting  # type: ignore[assignment]
    from anvil_ctl.cli import console

    console()


if __name__ == "__main__":
    main()
