"""The one-page report in a real headless Chromium (Debian's `chromium`): it loads from a file,
the page makes no request beyond its own file, and its plots render.

Two runs: `--headless --screenshot` writes the PNG; a second run is driven over the DevTools
protocol on a pipe (`--remote-debugging-pipe`, no port), which reports every request the page
makes (`Network.requestWillBeSent`) and lets the test read the rendered DOM. The browser's own
background services are not the page's requests; they go to a local dead-end proxy that
answers 404, so nothing leaves the machine even outside the test environment. A planted page
with one external image shows that the check does see what a page fetches.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.evidence.bundle import Bundle, ReportInputs
from anvil_ctl.evidence.report import render_page
from tests.unit.reportbundle import qualification_bundle

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("ANVIL_REQUIRE_INTEGRATION") == "1":
            pytest.fail("Debian's chromium is not installed (make debs installs it)")
        pytest.skip("Debian's chromium is not installed (make debs installs it)")
    return found


class DeadEnd(BaseHTTPRequestHandler):
    """A proxy that forwards nothing: every request gets 404."""

    def _refuse(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = do_CONNECT = _refuse

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def dead_end() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), DeadEnd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"--proxy-server=http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class DevTools:
    """Chromium driven over `--remote-debugging-pipe` (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, profile: Path, *flags: str) -> None:
        to_parent_r, to_parent_w = os.pipe()
        to_child_r, to_child_w = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads commands, fd 4 writes answers
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(to_parent_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, "--remote-debugging-pipe"],
            preexec_fn=wire,  # noqa: PLW1509 (a test; nothing else forks meanwhile)
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(to_parent_w)
        self.rx, self.tx = to_parent_r, to_child_w
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.tx, json.dumps(message).encode() + b"\0")
        return self.next_id

    def until(self, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                message = json.loads(raw)
                self.events.append(message)
                if done(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.rx], [], [], left)
            if ready:
                self.buffer += os.read(self.rx, 1 << 16)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        sent = self.send(method, params, session)
        answer = self.until(lambda m: m.get("id") == sent)
        assert answer is not None and "error" not in answer, (method, answer)
        return answer["result"]

    def open(self, url: str) -> str:
        """Load `url` in a new page and wait for its load event (then 1 s for late requests)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session: str = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Network.enable", session=session)
        self.call("Page.enable", session=session)
        self.call("Page.navigate", {"url": url}, session=session)
        assert self.until(lambda m: m.get("method") == "Page.loadEventFired") is not None
        self.until(lambda m: False, timeout=1.0)
        return session

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result["result"]["value"]

    def close(self) -> None:
        self.send("Browser.close")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.rx)
        os.close(self.tx)


@pytest.fixture
def devtools(tmp_path: Path, dead_end: str) -> Iterator[DevTools]:
    browser = DevTools(tmp_path / "profile", dead_end, "--proxy-bypass-list=<-loopback>")
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chromium-report")
    page = root / "report.html"
    page.write_text(render_page(ReportInputs(Bundle.load(qualification_bundle(root)))))
    return page


class TestReportInChromium:
    def test_headless_screenshot_of_the_page(self, report: Path, tmp_path: Path, dead_end: str) -> None:
        shot = tmp_path / "report.png"
        done = subprocess.run(
            [
                chromium(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={tmp_path / 'profile'}",
                dead_end,
                "--window-size=1280,4800",
                f"--screenshot={shot}",
                report.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000

    def test_the_page_requests_nothing_but_itself_and_renders_its_plots(
        self, report: Path, devtools: DevTools
    ) -> None:
        session = devtools.open(report.as_uri())
        assert devtools.requests() == [report.as_uri()]
        assert devtools.evaluate(session, "document.querySelectorAll('svg').length") == 2
        drawn = devtools.evaluate(
            session, "Array.from(document.querySelectorAll('svg')).map(s => s.getBoundingClientRect().height)"
        )
        assert all(h > 150 for h in drawn), drawn
        text = devtools.evaluate(session, "document.body.innerText")
        for title in ("Time to first token", "Prefill", "Decode", "Free VRAM per card against the reserve"):
            assert title in text
        assert "POLICY-INFEASIBLE" in text and "External-prior evidence" in text

    def test_the_check_sees_a_page_that_fetches(self, devtools: DevTools, tmp_path: Path) -> None:
        page = tmp_path / "fetches.html"
        page.write_text('<!DOCTYPE html><html><body><img src="http://example.invalid/x.png"></body></html>')
        devtools.open(page.as_uri())
        assert devtools.requests() == [page.as_uri(), "http://example.invalid/x.png"]
