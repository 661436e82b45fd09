"""Verify a pinned model in a Hugging Face hub cache, read-only.

Layout checked (`<cache>` is the hub directory, e.g. ~/.cache/huggingface/hub):

    <cache>/models--<org>--<name>/snapshots/<revision>/...   files or links into ../../blobs
    <cache>/models--<org>--<name>/blobs/<hash>[.incomplete]
    <cache>/models--<org>--<name>/refs/<ref>                  optional: a commit hash

Complete means: the snapshot directory exists and holds at least one file, no
`*.incomplete` blob remains (a download was cut), and every snapshot entry
resolves to a regular file. Problems are reported, never raised: the caller
(the load transaction's refusal check) decides. Nothing is downloaded or written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from anvil_ctl.core.errors import BadInput

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class CacheReport:
    """What the cache holds for one pinned model; `complete` only when `problems` is empty."""

    repo_id: str
    revision: str
    snapshot_path: str
    complete: bool
    problems: tuple[str, ...] = ()
    total_bytes: int = 0
    file_count: int = 0
    refs: dict[str, str] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return f"{self.repo_id}@{self.revision}"


def repo_folder(repo_id: str) -> str:
    """`org/name` -> `models--org--name`, the hub's folder name for a model repository."""
    return "models--" + repo_id.replace("/", "--")


def parse_identity(identity: str) -> tuple[str, str]:
    """`org/name@<40 hex>` -> (repo_id, revision); BadInput otherwise."""
    repo_id, sep, revision = identity.partition("@")
    if not sep or not REPO_ID_RE.match(repo_id) or not REVISION_RE.match(revision):
        raise BadInput(
            f"model identity {identity!r}: expected ORG/NAME@<40 lowercase hex revision>",
            field="model",
        )
    return repo_id, revision


class HfCache:
    """A Hugging Face hub cache directory, verified read-only."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def verify_identity(self, identity: str) -> CacheReport:
        repo_id, revision = parse_identity(identity)
        return self.verify(repo_id, revision)

    def verify(self, repo_id: str, revision: str) -> CacheReport:
        if not REPO_ID_RE.match(repo_id) or not REVISION_RE.match(revision):
            raise BadInput(
                f"model {repo_id}@{revision}: expected ORG/NAME and a 40-hex revision",
                field="model",
            )
        repo_dir = self.cache_dir / repo_folder(repo_id)
        snapshot = repo_dir / "snapshots" / revision
        problems: list[str] = []
        total = 0
        count = 0
        if not repo_dir.is_dir():
            problems.append(f"{repo_dir}: repository not in the cache")
        elif not snapshot.is_dir():
            problems.append(f"{snapshot}: revision {revision} not in the cache")
        else:
            problems.extend(_incomplete_blobs(repo_dir / "blobs"))
            total, count, entry_problems = _walk_snapshot(snapshot)
            problems.extend(entry_problems)
            if count == 0 and not entry_problems:
                problems.append(f"{snapshot}: snapshot holds no files")
        return CacheReport(
            repo_id=repo_id,
            revision=revision,
            snapshot_path=str(snapshot),
            complete=not problems,
            problems=tuple(problems),
            total_bytes=total,
            file_count=count,
            refs=_refs(repo_dir / "refs"),
        )


def _incomplete_blobs(blobs: Path) -> list[str]:
    try:
        names = sorted(os.listdir(blobs))
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{blobs}: cannot list blobs: {exc.strerror}"]
    return [f"{blobs / n}: incomplete download" for n in names if n.endswith(".incomplete")]


def _walk_snapshot(snapshot: Path) -> tuple[int, int, list[str]]:
    """(total bytes of resolved files, file count, problems) of a snapshot directory."""
    total = 0
    count = 0
    problems: list[str] = []

    def on_error(exc: OSError) -> None:
        problems.append(f"{exc.filename}: cannot read: {exc.strerror}")

    # Snapshot subdirectories are real directories; only files are links into blobs.
    for root, dirs, files in os.walk(snapshot, onerror=on_error):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            rel = path.relative_to(snapshot)
            try:
                st = path.stat()  # follows the link into blobs
            except FileNotFoundError:
                target = os.readlink(path) if path.is_symlink() else "?"
                problems.append(f"{rel}: broken link -> {target}")
                continue
            except OSError as exc:
                problems.append(f"{rel}: cannot stat: {exc.strerror}")
                continue
            if path.is_dir():
                problems.append(f"{rel}: link to a directory, expected a file")
                continue
            total += st.st_size
            count += 1
    return total, count, problems


def _refs(refs_dir: Path) -> dict[str, str]:
    """Optional refs (branch or tag -> commit); unreadable ones are skipped."""
    out: dict[str, str] = {}
    if not refs_dir.is_dir():
        return out
    for path in sorted(p for p in refs_dir.rglob("*") if p.is_file()):
        try:
            out[path.relative_to(refs_dir).as_posix()] = path.read_text().strip()
        except OSError:
            continue
    return out
