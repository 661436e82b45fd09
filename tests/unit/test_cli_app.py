"""anvil_ctl.cli.app: global options anywhere, --version, and the one mapping of errors to exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from anvil_ctl.core.errors import Refused
from anvil_ctl.core.states import ExitCode
from tests.unit.clirun import Run, child, in_process
from tests.unit.fakehost import FakeHost


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(fake_host, monkeypatch, capsys)


class TestGlobalOptions:
    def test_json_after_the_subcommand_prints_what_json_before_it_prints(self, anvilctl: Run) -> None:
        before = anvilctl("--json", "audit", "transactions")
        after = anvilctl("audit", "transactions", "--json")
        between = anvilctl("audit", "--json", "transactions")
        assert before.code == after.code == between.code == ExitCode.OK
        assert before.json() == after.json() == between.json()
        assert [t["kind"] for t in after.json()] == ["adopt"]

    def test_state_dir_after_the_subcommand_overrides_the_environment(
        self, anvilctl: Run, tmp_path: Path
    ) -> None:
        empty = tmp_path / "elsewhere"
        r = anvilctl("audit", "transactions", "--state-dir", str(empty))
        assert r.code == ExitCode.BAD_INPUT
        assert "run `anvilctl init`" in r.err

    def test_config_after_the_subcommand_is_the_host_config_read(self, anvilctl: Run, tmp_path: Path) -> None:
        r = anvilctl("status", "--config", str(tmp_path / "missing.toml"))
        assert r.code == ExitCode.BAD_INPUT
        assert "missing.toml" in r.err

    def test_state_is_never_taken_for_state_db_or_state_dir(self, anvilctl: Run) -> None:
        r = anvilctl("audit", "transactions", "--state", "committed", "--kind", "adopt", "--json")
        assert r.code == ExitCode.OK, r.err
        assert [(t["kind"], t["state"]) for t in r.json()] == [("adopt", "committed")]

    def test_a_bad_settings_variable_is_named(self, anvilctl: Run, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("ANVIL_BACKEND", "imaginary")
        r = anvilctl("status")
        assert r.code == ExitCode.BAD_INPUT
        assert "ANVIL_BACKEND" in r.err


class TestVersion:
    def test_version_prints_the_installed_package_version(self) -> None:
        r = child("--version")
        assert r.code == ExitCode.OK
        assert r.out == f"anvilctl {version('anvil-ctl')}\n"


class TestUsageErrors:
    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["audit", "nonsense"], "No such command 'nonsense'"),
            (["nonsense"], "No such command 'nonsense'"),
            (["audit"], "missing command"),
            ([], "missing command"),
            (["load"], "Missing argument 'RECIPE'"),
            (["load", "stub-245k-c1"], "Missing option '--slot'"),
            (["audit", "transactions", "--bogus"], "No such option '--bogus'"),
            (["audit", "transactions", "--state", "done"], "Invalid value for '--state'"),
            (["audit", "transactions", "--limit", "0"], "Invalid value for '--limit'"),
        ],
    )
    def test_a_usage_error_exits_2_with_one_line_on_stderr(self, args: list[str], message: str) -> None:
        r = child(*args)
        assert r.code == ExitCode.BAD_INPUT
        assert r.out == ""
        assert r.err.count("\n") == 1 and r.err.startswith("anvilctl: error: ")
        assert message in r.err
        assert "Usage:" not in r.err


class TestErrorMapping:
    def test_an_anvil_error_exits_with_its_own_code_in_one_line(
        self, anvilctl: Run, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from anvil_ctl.commands import admin

        def refuse(app: object) -> None:
            raise Refused("the host lock is held by pid 4711")

        monkeypatch.setattr(admin, "status", refuse)
        r = anvilctl("status")
        assert r.code == ExitCode.REFUSED
        assert r.err == "anvilctl: error: the host lock is held by pid 4711\n"

    def test_an_unexpected_exception_exits_1_and_suggests_debug(
        self, anvilctl: Run, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from anvil_ctl.commands import admin

        def crash(app: object) -> None:
            raise ZeroDivisionError("boom")

        monkeypatch.setattr(admin, "status", crash)
        r = anvilctl("status")
        assert r.code == ExitCode.INTERNAL
        assert r.err == "anvilctl: error: internal error: ZeroDivisionError: boom (rerun with --debug)\n"
        with pytest.raises(ZeroDivisionError):
            anvilctl("status", "--debug")

    def test_ctrl_c_exits_130(self, anvilctl: Run, monkeypatch: pytest.MonkeyPatch) -> None:
        from anvil_ctl.commands import admin

        def interrupted(app: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(admin, "status", interrupted)
        r = anvilctl("status")
        assert r.code == 130
        assert "anvilctl: interrupted" in r.err

    def test_an_unknown_slot_exits_2_naming_it(self, fake_host: FakeHost) -> None:
        r = child("load", "stub-245k-c1", "--slot", "nope", env=fake_host.env())
        assert r.code == ExitCode.BAD_INPUT
        assert "slot 'nope'" in r.err and "Traceback" not in r.err


COLLECTOR = """
import gc, json, sys, time
from anvil_ctl.cli import app

app.STARTING_S = 0.3
seen = {}


def main(argv=None):
    seen["during"] = gc.isenabled()
    return 0


if sys.argv[1] == "main":  # a library caller: main keeps the collector as it is
    app.main(["--version"])
    print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
    sys.exit(0)
app.main = main
started = time.monotonic()
deadline = started + 30
real_exit = app.os._exit


def watch(code):
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({**seen, "after": gc.isenabled(), "frozen": gc.get_freeze_count(),
                      "waited": time.monotonic() - started}), flush=True)
    real_exit(code)


app.os._exit = watch
app.console()
"""


class TestCollectorWhileStarting:
    """The console entry point runs its start without the cyclic garbage collector, then turns
    it back on with what the start built frozen; `main` alone leaves it as it is."""

    def run(self, mode: str) -> dict[str, object]:
        r = subprocess.run(
            [sys.executable, "-c", COLLECTOR, mode], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        report: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
        return report

    def test_the_console_starts_without_the_collector_and_turns_it_back_on(self) -> None:
        report = self.run("console")
        assert report["during"] is False
        assert report["after"] is True and isinstance(report["frozen"], int) and report["frozen"] > 0
        assert isinstance(report["waited"], float) and report["waited"] >= 0.3

    def test_main_called_by_a_library_keeps_the_collector_on(self) -> None:
        assert self.run("main") == {"enabled": True, "frozen": 0}
