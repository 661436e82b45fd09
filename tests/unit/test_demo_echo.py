"""The demo's command runner (scripts/campaign.py, `Campaign.anvilctl(echo=True)`) prints a
command's line first and its progress lines while it runs, then its result: `make demo` is
never dark for the length of a command."""

from __future__ import annotations

import io
import threading
from contextlib import redirect_stdout
from pathlib import Path

from scripts.campaign import Campaign
from tests.unit.fakehost import FakeHost
from tests.unit.test_cli_progress import PAUSE_AT, fake_recipe, wait_for


class LockedBuffer(io.StringIO):
    """stdout shared by the runner's threads and the test, read while written."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def test_progress_is_echoed_while_the_command_runs_and_the_result_after(
    fake_host: FakeHost, tmp_path: Path
) -> None:
    env = fake_host.env() | {"ANVIL_RECIPES_DIR": str(fake_recipe(fake_host)), "ANVIL_PAUSE_AT": PAUSE_AT}
    camp = Campaign(work=tmp_path, router=None, admin_token="", client_token="", env=env)  # type: ignore[arg-type]
    out = LockedBuffer()
    done: list[int] = []

    def run() -> None:
        with redirect_stdout(out):
            done.append(camp.anvilctl("load", "fake-393k", "--slot", "primary", echo=True).returncode)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    pause = fake_host.settings.pause_file
    try:
        wait_for(pause.exists, "the load to pause inside its transaction")
        wait_for(lambda: "[4/6] start-candidate:" in out.text(), "start-candidate echoed")
        so_far = out.text()
        assert not done  # the command is still running
        assert so_far.startswith("$ anvilctl load fake-393k --slot primary\n")
        assert "drain-tier: done in" in so_far
        assert "load: committed" not in so_far and '{"event"' not in so_far
    finally:
        pause.unlink(missing_ok=True)
        runner.join(timeout=120)
    assert done == [0]
    text = out.text()
    assert text.index("load committed after") < text.index("load: committed  (transaction ")
    assert text.rstrip().endswith("(exit 0)")
