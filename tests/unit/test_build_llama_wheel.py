"""Two `make llama` runs at once (two checkouts, one cache): the second waits for the build lock,
then finds the wheel the first one built and uses it instead of building it again."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from scripts import build_llama_wheel as blw


def test_a_build_that_waited_for_the_lock_uses_the_wheel_built_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "build"
    monkeypatch.setattr(blw, "BUILD_ROOT", root)
    monkeypatch.setattr(blw, "fetch_sdist", lambda cache: pytest.fail("built again"))
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = cache / blw.WHEEL_GLOB.replace("*", "cp311-cp311-linux_x86_64")
    lock = root.with_name(root.name + ".lock")
    got: list[Path] = []
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the first run, building
        waiter = threading.Thread(target=lambda: got.append(blw.build_wheel(cache)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # it waits for the lock
        wheel.write_bytes(b"the first run's wheel")
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(30)
    assert not waiter.is_alive()
    assert got == [wheel]
    assert not root.exists()  # the build tree was never touched
