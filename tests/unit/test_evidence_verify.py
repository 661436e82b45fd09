"""`evidence verify`: a bundle is bound to the record by its manifest's own SHA-256.

Every manifest anvil_ctl writes (a qualify run's, an export's) has its SHA-256
recorded in the state database. An artifact edited together with its `sha256`
and `size` in the manifest still matches the manifest; it no longer matches the
database (or the `--expect-manifest` printed at export), and verify says which
reference it used.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.core.states import ExitCode
from anvil_ctl.evidence.bundle import EvidenceWriter
from anvil_ctl.persistence import qualification
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

TX = "tx-evidence"


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(fake_host, monkeypatch, capsys)


@pytest.fixture
def recorded(fake_host: FakeHost) -> Path:
    """A transaction's evidence directory whose manifest the database recorded (as qualify does)."""
    app = fake_host.app()
    writer = EvidenceWriter(app.settings.evidence_dir, TX)
    writer.write_json("01-smoke.json", {"passed": True, "latency_ms": 41})
    writer.write_json("02-reserve.json", {"free_mib": 2101})
    manifest = writer.write_manifest(outcome="failed")
    qualification.record_manifest(app.store, TX, manifest.sha256, kind="qualify")
    return writer.tx_dir


def edit_consistently(directory: Path, artifact: str, data: dict[str, Any]) -> None:
    """Change an artifact and update its sha256 and size in the manifest, as a forger would."""
    payload = (json.dumps(data, sort_keys=True, indent=2) + "\n").encode()
    (directory / artifact).write_bytes(payload)
    manifest = json.loads((directory / "manifest.json").read_text())
    for entry in manifest["artifacts"]:
        if entry["path"] == artifact:
            entry["sha256"] = hashlib.sha256(payload).hexdigest()
            entry["size"] = len(payload)
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def audit_entries(host: FakeHost) -> int:
    con = sqlite3.connect(host.settings.state_dir / "anvil.db")
    try:
        return int(con.execute("SELECT count(*) FROM audit_journal").fetchone()[0])
    finally:
        con.close()


class TestAgainstTheDatabase:
    def test_a_recorded_directory_verifies_and_says_against_what(self, anvilctl: Run, recorded: Path) -> None:
        r = anvilctl("evidence", "verify", str(recorded), "--json")
        assert r.code == ExitCode.OK, r.out
        result = r.json()
        assert result["bound"] is True and result["manifest_sha256"] == sha(recorded / "manifest.json")
        assert result["bindings"] == [
            {"against": "database", "expected": [result["manifest_sha256"]], "matched": True, "note": ""}
        ]
        human = anvilctl("evidence", "verify", str(recorded))
        assert "manifest matches database" in human.out

    def test_an_artifact_edited_with_its_manifest_entry_is_named(self, anvilctl: Run, recorded: Path) -> None:
        recorded_sha = sha(recorded / "manifest.json")
        edit_consistently(recorded, "02-reserve.json", {"free_mib": 9101})
        r = anvilctl("evidence", "verify", str(recorded), "--json")
        assert r.code == ExitCode.DRIFT
        result = r.json()
        # Every file matches the (edited) manifest; the manifest is not the recorded one.
        assert [(m["path"], m["problem"]) for m in result["mismatches"]] == [
            ("manifest.json", "manifest_sha256")
        ]
        assert result["mismatches"][0]["expected"] == f"database: {recorded_sha}"
        assert result["bindings"][0]["matched"] is False
        assert "manifest DIFFERS from database" in anvilctl("evidence", "verify", str(recorded)).out

    def test_audit_evidence_holds_the_directory_to_the_database_too(
        self, anvilctl: Run, recorded: Path
    ) -> None:
        assert anvilctl("audit", "evidence", TX).code == ExitCode.OK
        edit_consistently(recorded, "01-smoke.json", {"passed": True, "latency_ms": 1})
        r = anvilctl("audit", "evidence", TX, "--json")
        assert r.code == ExitCode.DRIFT and r.json()["verify"]["bound"] is False


class TestExport:
    def test_an_export_is_recorded_and_its_bundle_verifies_against_the_database(
        self, anvilctl: Run, recorded: Path, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        out = anvilctl("evidence", "export", TX, str(tmp_path / "bundle"), "--json")
        assert out.code == ExitCode.OK, out.err
        exported = out.json()
        assert exported["recorded"] is True
        assert exported["manifest"]["sha256"] == sha(tmp_path / "bundle" / "manifest.json")
        kinds = [m.kind for m in qualification.manifests(fake_host.app().store, TX)]
        assert kinds == ["qualify", "export"]
        r = anvilctl("evidence", "verify", str(tmp_path / "bundle"), "--json")
        assert r.code == ExitCode.OK and r.json()["bindings"][0]["against"] == "database"

    def test_a_consistently_edited_bundle_is_named(
        self, anvilctl: Run, recorded: Path, tmp_path: Path
    ) -> None:
        assert anvilctl("evidence", "export", TX, str(tmp_path / "bundle")).code == ExitCode.OK
        edit_consistently(tmp_path / "bundle", "02-reserve.json", {"free_mib": 9101})
        r = anvilctl("evidence", "verify", str(tmp_path / "bundle"), "--json")
        assert r.code == ExitCode.DRIFT
        assert [m["problem"] for m in r.json()["mismatches"]] == ["manifest_sha256"]

    def test_a_consistently_edited_source_is_not_exported(
        self, anvilctl: Run, recorded: Path, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        edit_consistently(recorded, "02-reserve.json", {"free_mib": 9101})
        before = audit_entries(fake_host)
        r = anvilctl("evidence", "export", TX, str(tmp_path / "bundle"))
        assert r.code == ExitCode.BAD_INPUT and "refusing to export" in r.err
        assert not (tmp_path / "bundle").exists()
        assert audit_entries(fake_host) == before


class TestWithoutADatabase:
    """On a host with no state database: --expect-manifest, or the bundle is unbound."""

    @pytest.fixture
    def elsewhere(
        self, anvilctl: Run, recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Path:
        assert anvilctl("evidence", "export", TX, str(tmp_path / "bundle")).code == ExitCode.OK
        monkeypatch.setenv("ANVIL_STATE_DIR", str(tmp_path / "no-state"))
        return tmp_path / "bundle"

    def test_a_bundle_nothing_vouches_for_is_unbound_and_no_database_is_created(
        self, anvilctl: Run, elsewhere: Path, tmp_path: Path
    ) -> None:
        r = anvilctl("evidence", "verify", str(elsewhere), "--json")
        assert r.code == ExitCode.DRIFT
        result = r.json()
        assert result["bound"] is False
        assert [m["problem"] for m in result["mismatches"]] == ["unbound"]
        assert result["bindings"][0]["note"].startswith("no state database at")
        assert not (tmp_path / "no-state").exists()

    def test_the_sha_printed_at_export_binds_it(self, anvilctl: Run, elsewhere: Path) -> None:
        printed = sha(elsewhere / "manifest.json")
        r = anvilctl("evidence", "verify", str(elsewhere), "--expect-manifest", printed, "--json")
        assert r.code == ExitCode.OK
        assert [(b["against"], b["matched"]) for b in r.json()["bindings"]] == [
            ("database", None),
            ("--expect-manifest", True),
        ]
        assert (
            "manifest matches --expect-manifest"
            in anvilctl("evidence", "verify", str(elsewhere), "--expect-manifest", printed).out
        )

    def test_a_consistent_edit_differs_from_the_printed_sha(self, anvilctl: Run, elsewhere: Path) -> None:
        printed = sha(elsewhere / "manifest.json")
        edit_consistently(elsewhere, "01-smoke.json", {"passed": False})
        r = anvilctl("evidence", "verify", str(elsewhere), "--expect-manifest", printed, "--json")
        assert r.code == ExitCode.DRIFT
        assert [m["problem"] for m in r.json()["mismatches"]] == ["manifest_sha256"]

    @pytest.mark.parametrize("bad", ["abc", "A" * 64, "g" * 64, "a" * 63])
    def test_a_malformed_expect_manifest_is_bad_input(self, anvilctl: Run, elsewhere: Path, bad: str) -> None:
        r = anvilctl("evidence", "verify", str(elsewhere), "--expect-manifest", bad)
        assert r.code == ExitCode.BAD_INPUT
        assert r.err.count("\n") == 1 and "--expect-manifest" in r.err and "Traceback" not in r.err


class TestBothReferences:
    def test_the_database_and_the_printed_sha_must_both_agree(self, anvilctl: Run, recorded: Path) -> None:
        r = anvilctl("evidence", "verify", str(recorded), "--expect-manifest", "0" * 64, "--json")
        assert r.code == ExitCode.DRIFT
        assert [(b["against"], b["matched"]) for b in r.json()["bindings"]] == [
            ("database", True),
            ("--expect-manifest", False),
        ]
