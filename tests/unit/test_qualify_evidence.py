"""Evidence: artifacts once each, a SHA-256 manifest, redacted export, verification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anvil_ctl.core.errors import BadInput, StepFailed
from anvil_ctl.evidence.bundle import EvidenceWriter, Redaction, export_bundle, verify_bundle

UUID_A = "GPU-0123abcd-0123-4567-89ab-0123456789ab"
UUID_B = "GPU-ffffffff-0000-1111-2222-333333333333"


@pytest.fixture
def tx_dir(tmp_path: Path) -> Path:
    writer = EvidenceWriter(tmp_path / "state" / "evidence", "tx-1")
    writer.write_json(
        "01-reserve.json",
        {"cards": [{"uuid": UUID_A, "free": 1}, {"uuid": UUID_B}], "again": UUID_A},
    )
    writer.write_json(
        "02-smoke.json", {"log": f"{tmp_path}/state/evidence/tx-1/x", "token": "sk-very-secret"}
    )
    writer.write_manifest(outcome="verified")
    return writer.tx_dir


class TestEvidenceWriter:
    def test_the_manifest_lists_every_artifact_with_hash_and_size(self, tx_dir: Path) -> None:
        manifest = json.loads((tx_dir / "manifest.json").read_text())
        assert [a["path"] for a in manifest["artifacts"]] == ["01-reserve.json", "02-smoke.json"]
        for entry in manifest["artifacts"]:
            assert entry["size"] == (tx_dir / entry["path"]).stat().st_size
            assert len(entry["sha256"]) == 64
        assert manifest["outcome"] == "verified"

    def test_an_artifact_is_never_overwritten(self, tmp_path: Path) -> None:
        writer = EvidenceWriter(tmp_path, "tx")
        writer.write_json("a.json", {"v": 1})
        with pytest.raises(StepFailed):
            writer.write_json("a.json", {"v": 2})
        assert json.loads((tmp_path / "tx" / "a.json").read_text()) == {"v": 1}

    @pytest.mark.parametrize("name", ["../escape.json", "manifest.json", ""])
    def test_unsafe_artifact_names_are_refused(self, tmp_path: Path, name: str) -> None:
        with pytest.raises(BadInput):
            EvidenceWriter(tmp_path, "tx").write_json(name, {})

    def test_an_unsafe_transaction_id_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(BadInput):
            EvidenceWriter(tmp_path, "../tx")


class TestVerify:
    def test_an_untouched_directory_verifies(self, tx_dir: Path) -> None:
        result = verify_bundle(tx_dir)
        assert result.ok and result.checked == 2

    def test_one_changed_byte_is_a_mismatch(self, tx_dir: Path) -> None:
        path = tx_dir / "02-smoke.json"
        data = bytearray(path.read_bytes())
        data[5] ^= 0x01
        path.write_bytes(bytes(data))
        result = verify_bundle(tx_dir)
        assert not result.ok
        assert [(m.path, m.problem) for m in result.mismatches] == [("02-smoke.json", "sha256")]

    def test_missing_unlisted_and_resized_files_are_all_listed(self, tx_dir: Path) -> None:
        (tx_dir / "01-reserve.json").unlink()
        (tx_dir / "extra.json").write_text("{}")
        (tx_dir / "02-smoke.json").write_text("{}")
        problems = {(m.path, m.problem) for m in verify_bundle(tx_dir).mismatches}
        assert problems == {
            ("01-reserve.json", "missing"),
            ("extra.json", "unlisted"),
            ("02-smoke.json", "size"),
            ("02-smoke.json", "sha256"),
        }

    def test_a_directory_without_manifest_does_not_verify(self, tmp_path: Path) -> None:
        result = verify_bundle(tmp_path)
        assert not result.ok and result.mismatches[0].problem == "manifest"


class TestExport:
    def test_the_bundle_hides_gpu_uuids_host_paths_and_secrets(self, tx_dir: Path, tmp_path: Path) -> None:
        out = tmp_path / "bundle"
        result = export_bundle(tx_dir, out, redact=Redaction(secrets=("sk-very-secret",)))
        text = "".join(p.read_text() for p in out.iterdir())
        assert UUID_A not in text and UUID_B not in text
        assert "sk-very-secret" not in text
        assert str(tmp_path) not in text
        reserve = json.loads((out / "01-reserve.json").read_text())
        # The same card keeps the same pseudonym, so comparisons survive redaction.
        assert reserve["cards"][0]["uuid"] == reserve["again"] == "GPU-REDACTED-1"
        assert reserve["cards"][1]["uuid"] == "GPU-REDACTED-2"
        assert result.redactions["secrets"] == 1 and result.redactions["gpu_uuids"] == 3
        assert verify_bundle(out).ok

    def test_the_bundle_fails_verification_after_one_byte_changes(self, tx_dir: Path, tmp_path: Path) -> None:
        out = tmp_path / "bundle"
        export_bundle(tx_dir, out)
        path = out / "01-reserve.json"
        data = bytearray(path.read_bytes())
        data[-2] = ord("X")
        path.write_bytes(bytes(data))
        result = verify_bundle(out)
        assert not result.ok and result.mismatches[0].path == "01-reserve.json"

    def test_a_tampered_source_is_refused_and_nothing_is_written(self, tx_dir: Path, tmp_path: Path) -> None:
        (tx_dir / "02-smoke.json").write_text("{}")
        out = tmp_path / "bundle"
        with pytest.raises(BadInput) as info:
            export_bundle(tx_dir, out)
        assert info.value.data["mismatches"]
        assert not out.exists()

    def test_a_non_empty_target_is_refused(self, tx_dir: Path, tmp_path: Path) -> None:
        out = tmp_path / "bundle"
        out.mkdir()
        (out / "keep").write_text("x")
        with pytest.raises(BadInput):
            export_bundle(tx_dir, out)
        assert (out / "keep").read_text() == "x"
