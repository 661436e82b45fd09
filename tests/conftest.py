"""Shared fixtures. Logs go to stderr at warning level so test output stays readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.log import configure
from tests.unit.fakehost import FakeHost, make_fake_host

configure("console", "warning")


@pytest.fixture(autouse=True)
def _no_default_places(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests name their state directory and host config; one that forgets gets empty places of
    its own, never the host's defaults (/var/lib/anvil and /etc/anvil/anvil.toml as root).
    A test of the defaults removes these variables itself."""
    unset = tmp_path_factory.mktemp("unset")
    monkeypatch.setenv("ANVIL_STATE_DIR", str(unset / "state"))
    monkeypatch.setenv("ANVIL_CONFIG", str(unset / "anvil.toml"))


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return make_fake_host(tmp_path)
