"""Hugging Face cache verification against caches the tests fabricate."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from anvil_ctl.adapters.hfcache import HfCache, parse_identity
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import CacheReport, ModelFile
from anvil_ctl.core.model import hub_repo_folder as repo_folder

REPO = "org/model-x"
REV = "c3cbb9891b67c741bcbf6b176dd7af9265b069db"
OTHER_REV = "0" * 40
FILES = {
    "config.json": b'{"architectures": ["X"]}',
    "model-00001-of-00002.safetensors": b"a" * 1000,
    "model-00002-of-00002.safetensors": b"b" * 500,
    "tokenizer/tokenizer.json": b"{}",
}


def make_cache(root: Path, files: dict[str, bytes] = FILES, revision: str = REV) -> Path:
    """A hub cache laid out as huggingface_hub writes it: blobs by hash, snapshot links."""
    repo = root / repo_folder(REPO)
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / revision
    for rel, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blobs / digest, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return repo


@pytest.fixture
def cache(tmp_path: Path) -> Callable[[], tuple[Path, Path]]:
    def build() -> tuple[Path, Path]:
        root = tmp_path / "hub"
        return root, make_cache(root)

    return build


class TestHfCacheVerify:
    def test_a_complete_snapshot_is_complete(self, cache: Callable[[], tuple[Path, Path]]) -> None:
        root, _ = cache()
        report = HfCache(root).verify_identity(f"{REPO}@{REV}")
        assert report.complete
        assert report.problems == ()

    def test_verifies_a_pinned_identity_string(self, cache: Callable[[], tuple[Path, Path]]) -> None:
        root, _ = cache()
        assert HfCache(root).verify_identity(f"{REPO}@{REV}").complete

    def test_a_missing_revision_is_incomplete_and_says_which(
        self, cache: Callable[[], tuple[Path, Path]]
    ) -> None:
        root, _ = cache()
        report = HfCache(root).verify_identity(f"{REPO}@{OTHER_REV}")
        assert not report.complete
        assert report.problems == (
            f"{root / repo_folder(REPO) / 'snapshots' / OTHER_REV}: revision {OTHER_REV} not in the cache",
        )

    def test_a_missing_repository_is_incomplete(self, tmp_path: Path) -> None:
        report = HfCache(tmp_path).verify_identity(f"{REPO}@{REV}")
        assert not report.complete
        assert "repository not in the cache" in report.problems[0]

    def test_an_incomplete_blob_makes_the_cache_incomplete(
        self, cache: Callable[[], tuple[Path, Path]]
    ) -> None:
        root, repo = cache()
        partial = repo / "blobs" / ("f" * 64 + ".incomplete")
        partial.write_bytes(b"half")
        report = HfCache(root).verify_identity(f"{REPO}@{REV}")
        assert not report.complete
        assert report.problems == (f"{partial}: incomplete download",)
        assert partial.exists(), "verification must not delete anything"

    def test_a_broken_link_is_named_with_its_target(self, cache: Callable[[], tuple[Path, Path]]) -> None:
        root, repo = cache()
        link = repo / "snapshots" / REV / "model-00002-of-00002.safetensors"
        target = os.readlink(link)
        (link.parent / target).unlink()
        report = HfCache(root).verify_identity(f"{REPO}@{REV}")
        assert not report.complete
        assert report.problems == (f"model-00002-of-00002.safetensors: broken link -> {target}",)

    def test_an_empty_snapshot_is_incomplete(self, tmp_path: Path) -> None:
        (tmp_path / repo_folder(REPO) / "snapshots" / REV).mkdir(parents=True)
        report = HfCache(tmp_path).verify_identity(f"{REPO}@{REV}")
        assert not report.complete
        assert "snapshot holds no files" in report.problems[0]

    def test_regular_files_without_links_count_too(self, tmp_path: Path) -> None:
        snapshot = tmp_path / repo_folder(REPO) / "snapshots" / REV
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_bytes(b"12345")
        report = HfCache(tmp_path).verify_identity(f"{REPO}@{REV}")
        assert (report.complete, report.problems) == (True, ())

    def test_the_report_is_frozen(self, tmp_path: Path) -> None:
        report = HfCache(tmp_path).verify_identity(f"{REPO}@{REV}")
        assert isinstance(report, CacheReport)
        with pytest.raises(AttributeError):
            report.complete = True  # type: ignore[misc]


class TestParseIdentity:
    def test_splits_repo_and_revision(self) -> None:
        assert parse_identity(f"{REPO}@{REV}") == (REPO, REV)

    @pytest.mark.parametrize("identity", [REPO, f"{REPO}@main", f"model@{REV}", f"{REPO}@{REV[:-1]}"])
    def test_refuses_an_unpinned_identity(self, identity: str) -> None:
        with pytest.raises(BadInput, match="40 lowercase hex"):
            parse_identity(identity)


class TestPinnedFiles:
    """verify_files: each pinned file is checked byte for byte (size, SHA-256, GGUF header)."""

    @staticmethod
    def pins(**overrides: object) -> list[ModelFile]:
        data = FILES["model-00001-of-00002.safetensors"]
        pin = {"path": "model-00001-of-00002.safetensors", "sha256": hashlib.sha256(data).hexdigest()}
        pin |= {"size": len(data)} | overrides
        return [ModelFile(**pin)]  # type: ignore[arg-type]

    def test_files_with_the_pinned_size_and_hash_pass(self, tmp_path: Path) -> None:
        make_cache(tmp_path)
        report = HfCache(tmp_path).verify_files(f"{REPO}@{REV}", self.pins())
        assert report.complete, report.problems

    def test_a_file_whose_bytes_differ_is_named_with_both_hashes(self, tmp_path: Path) -> None:
        files = dict(FILES) | {"model-00001-of-00002.safetensors": b"A" + b"a" * 999}  # same size
        make_cache(tmp_path, files)
        report = HfCache(tmp_path).verify_files(f"{REPO}@{REV}", self.pins())
        assert not report.complete
        (problem,) = report.problems
        assert problem.startswith("model-00001-of-00002.safetensors: SHA-256 ")
        assert "differs from the pinned" in problem

    def test_a_file_of_another_size_is_refused_before_hashing(self, tmp_path: Path) -> None:
        make_cache(tmp_path)
        report = HfCache(tmp_path).verify_files(f"{REPO}@{REV}", self.pins(size=999))
        assert report.problems == ("model-00001-of-00002.safetensors: 1000 bytes, expected the pinned 999",)

    def test_a_pinned_file_missing_from_the_snapshot_is_named(self, tmp_path: Path) -> None:
        make_cache(tmp_path)
        report = HfCache(tmp_path).verify_files(f"{REPO}@{REV}", self.pins(path="model.gguf"))
        assert not report.complete and "model.gguf: pinned file not in the snapshot" in report.problems[0]

    def test_a_gguf_file_must_read_back_as_gguf(self, tmp_path: Path) -> None:
        garbage = b"\x00" * 64
        make_cache(tmp_path, {"m.gguf": garbage})
        pin = ModelFile("m.gguf", hashlib.sha256(garbage).hexdigest(), len(garbage))
        report = HfCache(tmp_path).verify_files(f"{REPO}@{REV}", [pin])
        assert not report.complete and "not a readable GGUF file" in report.problems[0]
