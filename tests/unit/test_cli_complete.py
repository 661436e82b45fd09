"""anvil_ctl.cli.complete: completion scripts, and slot and recipe completion that never fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anvil_ctl import cli
from anvil_ctl.core.states import ExitCode
from tests.unit.clirun import REPO
from tests.unit.fakehost import HOST_TOML

BIN = Path(sys.executable).parent


def complete(words: str, *, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """What `anvilctl` offers for the last word of `words` (bash protocol, as the script asks)."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    r = subprocess.run(
        [sys.executable, "-m", "anvil_ctl"],
        env={
            **os.environ,
            **(env or {}),
            "_ANVILCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        },
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return [line.split(",", 1)[1] for line in r.stdout.splitlines() if line]


class TestCompletionScripts:
    @pytest.mark.parametrize(
        ("shell", "marker"), [("bash", "complete -o nosort"), ("zsh", "compdef"), ("fish", "complete")]
    )
    def test_each_shell_gets_a_script_bound_to_anvilctl(
        self, shell: str, marker: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["completion", shell]) == ExitCode.OK
        script = capsys.readouterr().out
        assert "_ANVILCTL_COMPLETE" in script and marker in script

    @pytest.mark.skipif(not (BIN / "anvilctl").exists() or shutil.which("bash") is None, reason="needs bash")
    def test_bash_sources_the_script_and_registers_the_completion(self) -> None:
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        r = subprocess.run(
            ["bash", "-c", "source <(anvilctl completion bash); complete -p anvilctl"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert "anvilctl" in r.stdout

    def test_an_unknown_shell_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(["completion", "tcsh"]) == ExitCode.BAD_INPUT
        assert "'tcsh' is not one of 'bash', 'zsh', 'fish'" in capsys.readouterr().err


class TestSlotCompletion:
    def test_slots_come_from_the_config_named_on_the_line(self, tmp_path: Path) -> None:
        config = tmp_path / "host.toml"
        config.write_text(HOST_TOML)
        assert complete(f"anvilctl --config {config} load x --slot ", cwd=tmp_path) == ["primary"]
        assert complete(f"anvilctl recheck --config {config} --slot pr", cwd=tmp_path) == ["primary"]
        assert complete(f"anvilctl recheck --config {config} --slot zz", cwd=tmp_path) == []

    def test_slots_come_from_anvil_config_in_the_environment(self, tmp_path: Path) -> None:
        config = tmp_path / "host.toml"
        config.write_text(HOST_TOML)
        assert complete("anvilctl qualify --slot ", cwd=tmp_path, env={"ANVIL_CONFIG": str(config)}) == [
            "primary"
        ]

    def test_a_missing_or_broken_config_completes_nothing_and_never_fails(self, tmp_path: Path) -> None:
        assert complete("anvilctl recheck --slot ", cwd=tmp_path) == []  # no anvil.toml here
        broken = tmp_path / "broken.toml"
        broken.write_text("slots = [[[")
        assert complete(f"anvilctl --config {broken} recheck --slot ", cwd=tmp_path) == []


class TestRecipeCompletion:
    def test_recipe_names_come_from_the_recipes_directory(self) -> None:
        offered = complete("anvilctl load stub-2", cwd=REPO)
        assert offered == ["stub-245k-c1"]
        assert "stub-393k-c1" in complete("anvilctl recipes plan ", cwd=REPO)

    def test_the_shipped_recipes_are_offered_from_any_directory(self, tmp_path: Path) -> None:
        assert "stub-393k-c1" in complete("anvilctl recipes show ", cwd=tmp_path)

    def test_a_recipes_directory_on_the_line_is_searched_before_the_shipped_ones(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "mine-1.toml").write_text("name = 'mine-1'\n")
        assert complete(f"anvilctl --recipes-dir {tmp_path} load mi", cwd=tmp_path) == ["mine-1"]

    def test_a_missing_recipes_directory_leaves_the_shipped_ones_and_never_fails(
        self, tmp_path: Path
    ) -> None:
        offered = complete("anvilctl load ", cwd=tmp_path, env={"ANVIL_RECIPES_DIR": str(tmp_path / "none")})
        assert "stub-245k-c1" in offered
