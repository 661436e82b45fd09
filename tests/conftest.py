"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.log import configure

configure("console", "warning")

from tests.unit.fakehost import FakeHost, make_fake_host


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return make_fake_host(tmp_path)
