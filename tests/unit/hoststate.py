"""What a refused command must leave as it was, and a way to run one with its own environment."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.unit.fakehost import FakeHost


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """os.environ with every ANVIL_* replaced by `values`, for the length of one run."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("ANVIL_")]:
        del os.environ[key]
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tree(root: Path) -> list[tuple[str, str, int]]:
    """Every entry under `root`: relative path, kind and size (symlinks not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted([*dirnames, *filenames]):
            p = Path(dirpath) / name
            st = p.lstat()
            kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
            out.append((str(p.relative_to(root)), kind, st.st_size if kind == "file" else 0))
    return sorted(out)


def host_state(host: FakeHost, case_dir: Path) -> dict[str, Any]:
    """What no refused input may change: the database's rows, the state directory's files
    (the WAL and shared-memory files aside: readers touch them), the world, the case dir."""
    con = sqlite3.connect(f"file:{host.settings.state_dir / 'anvil.db'}?mode=ro", uri=True)
    try:
        dump = list(con.iterdump())
    finally:
        con.close()
    state = [e for e in tree(host.settings.state_dir) if not e[0].endswith(("-wal", "-shm", ".lock"))]
    return {
        "dump": dump,
        "state_dir": state,
        "world": host.settings.fake_world_path.read_text(),
        "case_dir": tree(case_dir),
    }
