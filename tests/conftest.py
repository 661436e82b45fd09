"""Shared fixtures. Logs go to stderr at warning level so test output stays readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.log import configure
from tests.unit.fakehost import FakeHost, make_fake_host

configure("console", "warning")


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return make_fake_host(tmp_path)
