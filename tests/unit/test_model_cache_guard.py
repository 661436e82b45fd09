"""load refuses, before anything stops, a candidate whose pinned model is not complete in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from anvil_ctl.commands import transactions
from anvil_ctl.core.model import ModelFile
from anvil_ctl.core.states import TxState
from tests.unit.fakehost import FakeHost

REV = "c3cbb9891b67c741bcbf6b176dd7af9265b069db"
MODEL = f"ormandj/GLM-5.3-Flash-W4A16-NVFP4-K32-Experts-FP8-WO@{REV}"


def fabricate(cache: Path, *, incomplete: bool) -> None:
    repo = cache / "models--ormandj--GLM-5.3-Flash-W4A16-NVFP4-K32-Experts-FP8-WO"
    snap = repo / "snapshots" / REV
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "aa11").write_bytes(b"x" * 1000)
    (snap / "config.json").symlink_to("../../blobs/aa11")
    if incomplete:
        (repo / "blobs" / "bb22.incomplete").write_bytes(b"partial")


def with_cache(host: FakeHost, cache: Path) -> None:
    cfg = host.settings.config
    cfg.write_text(f'model_cache_dir = "{cache}"\n' + cfg.read_text())


def candidate(host: FakeHost):  # type: ignore[no-untyped-def]
    return dataclasses.replace(host.candidate(), model_identity=MODEL)


class TestModelCacheGuard:
    def test_an_incomplete_cache_refuses_the_load_and_nothing_changes(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        fabricate(tmp_path / "hub", incomplete=True)
        with_cache(fake_host, tmp_path / "hub")
        before = fake_host.world.read()
        out = transactions.load(fake_host.app(), slot="primary", candidate=candidate(fake_host))
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "ModelCacheComplete"
        assert "incomplete" in out.reason
        assert fake_host.world.read() == before

    def test_a_complete_cache_lets_the_load_proceed(self, fake_host: FakeHost, tmp_path: Path) -> None:
        fabricate(tmp_path / "hub", incomplete=False)
        with_cache(fake_host, tmp_path / "hub")
        out = transactions.load(fake_host.app(), slot="primary", candidate=candidate(fake_host))
        assert out.state == TxState.COMMITTED, out.reason

    def test_a_pinned_model_without_a_configured_cache_is_refused(self, fake_host: FakeHost) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=candidate(fake_host))
        assert out.state == TxState.REFUSED and "model_cache_dir" in out.reason


class TestPinnedModelFiles:
    """A candidate that pins model files is refused, before anything stops, unless each one has
    exactly the pinned size and SHA-256 in the cache."""

    PIN_OK = ModelFile("config.json", hashlib.sha256(b"x" * 1000).hexdigest(), 1000)

    def test_a_file_whose_hash_differs_refuses_the_load_naming_it_and_nothing_changes(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        fabricate(tmp_path / "hub", incomplete=False)
        with_cache(fake_host, tmp_path / "hub")
        bad = dataclasses.replace(self.PIN_OK, sha256="0" * 64)
        before = fake_host.world.read()
        cand = dataclasses.replace(candidate(fake_host), model_files=(bad,))
        out = transactions.load(fake_host.app(), slot="primary", candidate=cand)
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "ModelCacheComplete"
        assert (
            "config.json: SHA-256 " in out.reason and "differs from the pinned 0000000000000000" in out.reason
        )
        assert fake_host.world.read() == before

    def test_files_matching_their_pins_let_the_load_proceed(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        fabricate(tmp_path / "hub", incomplete=False)
        with_cache(fake_host, tmp_path / "hub")
        cand = dataclasses.replace(candidate(fake_host), model_files=(self.PIN_OK,))
        out = transactions.load(fake_host.app(), slot="primary", candidate=cand)
        assert out.state == TxState.COMMITTED, out.reason
