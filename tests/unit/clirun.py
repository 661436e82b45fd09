"""Run `anvilctl` in this process (`cli.main`) or as a child, on a FakeHost, and capture what it printed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl import cli, log
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Run = Callable[..., Ran]


def in_process(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Run:
    """`run(*args)`: cli.main on the fake host. Logging stays as conftest set it: main would
    point structlog at pytest's captured stderr, which is closed after the test."""
    monkeypatch.setattr(log, "configure", lambda *_a, **_k: None)
    for key, value in fake_host.env().items():
        if key.startswith("ANVIL_"):
            monkeypatch.setenv(key, value)

    def run(*args: str) -> Ran:
        capsys.readouterr()
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def child(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> Ran:
    """`python -m anvil_ctl ARGS` in a child process."""
    r = subprocess.run(
        [sys.executable, "-m", "anvil_ctl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Ran(r.returncode, r.stdout, r.stderr)
