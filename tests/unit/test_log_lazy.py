"""structlog is loaded at the first log line that passes the level (`anvil_ctl.log`), not at
import: `status` on a healthy host logs nothing at `info` and so never loads it (nor rich,
which it and the terminal progress display would bring), while every line that passes is
written as structlog writes it, with the context a `bind` gave it.

Each case runs in a fresh interpreter: which modules a process loaded is the point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.fakehost import FakeHost

CHILD = """
import json, sys
from anvil_ctl.cli import main
code = main(sys.argv[1:])
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"structlog", "rich", "pygments"})
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
"""

LINES = """
import json, sys
from anvil_ctl import log
log.configure("json", sys.argv[1])
bound = log.get_logger("anvil.test").bind(tx_id="t-1", step="s")
plain = log.get_logger()
plain.debug("dropped.or.not", n=1)
print(json.dumps({"after_debug": "structlog" in sys.modules}), file=sys.stderr, flush=True)
bound.info("kept", n=2)
plain.warning("warned", n=3)
bound.debug("debug.bound", n=4)
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _lines(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_status_on_a_healthy_host_loads_neither_structlog_nor_rich(fake_host: FakeHost) -> None:
    r = _run(CHILD, "status", env=fake_host.env() | {"ANVIL_LOG_LEVEL": "info"})
    report = _lines(r.stderr)[-1]
    assert report["code"] == 0, r.stderr
    assert "serves" in r.stdout  # it did its work: the slot's serving line
    assert report["loaded"] == []


def test_a_command_that_logs_loads_structlog_and_writes_its_lines(fake_host: FakeHost) -> None:
    # recheck prints the audit head it recorded at info: structlog is loaded for that line
    r = _run(CHILD, "recheck", env=fake_host.env() | {"ANVIL_LOG_LEVEL": "info"})
    lines = _lines(r.stderr)
    assert lines[-1]["code"] == 0, r.stderr
    # its lines are JSON (stderr is a pipe): structlog without rich and pygments
    assert lines[-1]["loaded"] == ["structlog"], r.stderr
    head = [x for x in lines[:-1] if x.get("event") == "audit.head"]
    assert len(head) == 1 and head[0]["level"] == "info" and head[0]["seq"], r.stderr


RICH = """
import json, sys
from anvil_ctl import log
log.configure(sys.argv[1], "info")
log.get_logger().info("line", n=1)
import structlog.dev
before = "rich" in sys.modules
import rich.console  # whoever needs rich later still gets it
print(json.dumps({"rich_before": before, "structlog_sees_rich": structlog.dev.rich is not None,
                  "rich_after": rich.console.__name__}), file=sys.stderr)
"""


def test_json_lines_load_structlog_without_rich_and_rich_still_imports_afterwards() -> None:
    r = _run(RICH, "json")
    assert r.returncode == 0, r.stderr
    line, report = _lines(r.stderr)
    assert line["event"] == "line" and line["n"] == 1
    assert report == {"rich_before": False, "structlog_sees_rich": False, "rich_after": "rich.console"}


def test_console_lines_load_structlog_with_rich_for_its_exception_display() -> None:
    r = _run(RICH, "console")
    assert r.returncode == 0, r.stderr
    assert "line" in r.stderr.splitlines()[0]  # a console line, not JSON
    report = _lines(r.stderr)[-1]
    assert report == {"rich_before": True, "structlog_sees_rich": True, "rich_after": "rich.console"}


def test_lines_below_the_level_cost_no_import_and_the_rest_are_written_with_their_context() -> None:
    r = _run(LINES, "info")
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stderr)
    assert lines[0] == {"after_debug": False}  # a dropped line loaded nothing
    events = [(x["event"], x["level"], x.get("tx_id"), x.get("step"), x["n"]) for x in lines[1:]]
    assert events == [("kept", "info", "t-1", "s", 2), ("warned", "warning", None, None, 3)]
    assert all("timestamp" in x for x in lines[1:])


def test_at_debug_every_line_is_written() -> None:
    r = _run(LINES, "debug")
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stderr)
    assert lines[0]["event"] == "dropped.or.not" and lines[0]["level"] == "debug"
    assert lines[1] == {"after_debug": True}
    assert [x["event"] for x in lines[2:]] == ["kept", "warned", "debug.bound"]
    assert lines[-1]["tx_id"] == "t-1"


def test_no_module_of_ours_imports_structlog_itself() -> None:
    pkg = Path(__file__).resolve().parents[2] / "anvil_ctl"
    offenders = [
        str(p.relative_to(pkg))
        for p in pkg.rglob("*.py")
        if p.name != "log.py" and ("import structlog" in p.read_text() or "from structlog" in p.read_text())
    ]
    assert offenders == []


THREADS = """
import sys, threading
from anvil_ctl import log
log.configure("json", "info")
go = threading.Barrier(8)
def first_line(n):
    go.wait()
    log.get_logger().bind(thread=n).info("first", n=n)
threads = [threading.Thread(target=first_line, args=(n,)) for n in range(8)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_first_lines_of_several_threads_at_once_are_all_written_as_configured() -> None:
    # the configuration is applied once, before any of them is written: none goes out in
    # structlog's unconfigured form (a console line on stdout)
    r = _run(THREADS)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    lines = _lines(r.stderr)
    assert sorted(int(str(x["n"])) for x in lines) == list(range(8))
    assert all(x["event"] == "first" and x["thread"] == x["n"] for x in lines)
