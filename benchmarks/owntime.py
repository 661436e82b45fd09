"""Run `anvilctl` and note how long it waited on Docker and HTTP calls (benchmarks only).

    python benchmarks/owntime.py OUT.json status --slot primary

Wraps `requests.Session.send` (the Docker SDK) and `httpx.Client.send` (router, engine
probes) to add up the wall time spent inside them, runs the console entry point, and
writes `{"io_s": ..., "calls": ..., "libraries": [...]}` to OUT.json right before the
process exits. The parent times the whole process; its own time is that wall time minus
`io_s`. Both libraries are imported up front: a status on a real host imports them anyway,
and their import time stays in the process's own time.

`libraries` names the third-party packages the run imported (top-level names found in
`sys.modules` at exit whose files lie in site-packages, anvil_ctl itself excepted), so
that the parent can time a process that imports only those: the floor under anvilctl's
own time that is the libraries', not ours (`floor` below).

    python benchmarks/owntime.py --floor sqlalchemy docker ...

imports the named packages and exits the way `anvilctl` starts and exits (collector off,
`os._exit`, no teardown).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
from typing import Any

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


def libraries() -> list[str]:
    """Top-level third-party packages in `sys.modules`: those whose files lie in site-packages,
    other than anvil_ctl itself (an editable install's finder lives there too)."""
    site = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    names = []
    for name, module in list(sys.modules.items()):
        if "." in name or name == "anvil_ctl" or name.startswith("__editable__"):
            continue
        file = getattr(module, "__file__", None)
        if file and any(os.path.realpath(file).startswith(d + os.sep) for d in site):
            names.append(name)
    return sorted(names)


def floor(names: list[str]) -> None:
    """Import `names` and exit as anvilctl does: the libraries' share of a command's start.

    Without the cyclic garbage collector, as `anvilctl` starts (`cli.app.console`): what the
    collector would cost during the libraries' imports is then no one's, not a saving of ours.
    """
    import gc
    import importlib

    gc.disable()
    for name in names:
        importlib.import_module(name)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    # as the console entry point does before anything imports httpx (`cli.app._without_httpx_cli`),
    # so that this harness's own `import httpx` and the floor load what anvilctl loads
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    if sys.argv[1] == "--floor":
        floor(sys.argv[2:])
    import httpx
    import requests

    out, sys.argv = sys.argv[1], ["anvilctl", *sys.argv[2:]]
    requests.Session.send = timed(requests.Session.send)  # type: ignore[method-assign]
    httpx.Client.send = timed(httpx.Client.send)  # type: ignore[method-assign]
    real_exit = os._exit

    def exit_noting(code: int) -> None:
        with open(out, "w") as fh:
            json.dump({**spent, "libraries": libraries()}, fh)
        real_exit(code)

    os._exit = exit_noting  # type: ignore[assignment]
    from anvil_ctl.cli import console

    console()


if __name__ == "__main__":
    main()
