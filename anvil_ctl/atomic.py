"""`atomic_write`: replace a file so that a reader sees the old or the new content, never a mix.

A temporary file created with the final mode (a secret is never readable by others), fsynced,
renamed over the target, and the directory fsynced so the rename survives a power loss.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Write `data` to `path` atomically; `mode` defaults to the existing file's, else 0644."""
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
    raw = data.encode() if isinstance(data, str) else data
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
