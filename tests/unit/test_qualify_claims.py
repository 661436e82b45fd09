"""The claim ledger: claims files, paths into evidence, recounting from a verified bundle with
declared rounding, external-prior claims kept apart, the seeds' table, and the CLI's exits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.core.errors import BadInput
from anvil_ctl.evidence.bundle import EvidenceWriter
from anvil_ctl.evidence.claims import PathError, check_ledger, load_ledger, render_ledger, resolve
from anvil_ctl.qualify.runner import provenance_record
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

CELLS = [
    {"nominal_tokens": 4096, "concurrency": 1, "decode_tps_p50": 112.0712, "prompt_tokens_p50": 2969.0},
    {"nominal_tokens": 389120, "concurrency": 1, "decode_tps_p50": 99.7949, "prompt_tokens_p50": 304491.0},
]


def bundle(root: Path) -> Path:
    """A qualification's evidence: a capacity gate, the reserve gate, provenance, a manifest."""
    writer = EvidenceWriter(root, "tx-393k")
    writer.write_json("13-capacity.json", {"name": "capacity", "evidence": {"cells": CELLS}})
    writer.write_json(
        "15-vram_reserve.json", {"name": "vram_reserve", "evidence": {"cards": [{"free_mib": 2101}] * 2}}
    )
    source = {"release": "v0.1.1-rc.14", "external_prior": [{"figure": "roughly 8,100 tok/s prefill"}]}
    writer.write_json("provenance.json", provenance_record({"source": source}, writer.artifacts))
    writer.write_manifest()
    return writer.tx_dir


LEDGER = """\
title = "GLM-5.3-Flash SGLang 393K promotion"
finding = "promotion finding"

[[claims]]
claim = "112.07 decode tok/s"
published = "112.07"
conditions = "2,969 prompt tokens; C1; p50 of three"
artifact = "13-capacity.json"
path = "evidence.cells[nominal_tokens=4096,concurrency=1].decode_tps_p50"

  [[claims.condition]]
  published = "2,969"
  path = "evidence.cells[nominal_tokens=4096,concurrency=1].prompt_tokens_p50"

[[claims]]
claim = "99.8 decode tok/s at 304K"
published = 99.8
conditions = "304,491 prompt tokens; C1; p50 of three"
artifact = "13-capacity.json"
path = "evidence.cells[nominal_tokens=389120].decode_tps_p50"

[[claims]]
claim = "2,101 MiB/card free after qualification"
published = "2,101"
artifact = "15-vram_reserve.json"
path = "evidence.cards[0].free_mib"

[[claims]]
claim = "roughly 8,100 tok/s prefill"
origin = "external-prior"
conditions = "upstream stable release, native Linux"
source = "upstream stable release report"
"""


def write(tmp_path: Path, text: str = LEDGER) -> Path:
    path = tmp_path / "claims.toml"
    path.write_text(text)
    return path


class TestResolve:
    DATA: dict[str, Any] = {"evidence": {"cells": CELLS, "tags": ["a", "b"]}}

    @pytest.mark.parametrize(
        ("path", "value"),
        [
            ("evidence.cells[0].decode_tps_p50", 112.0712),
            ("evidence.cells[-1].prompt_tokens_p50", 304491.0),
            ("evidence.cells[nominal_tokens=389120,concurrency=1].decode_tps_p50", 99.7949),
            ("evidence.tags[1]", "b"),
        ],
    )
    def test_keys_indexes_and_selectors_lead_to_the_value(self, path: str, value: Any) -> None:
        assert resolve(self.DATA, path) == value

    @pytest.mark.parametrize(
        ("path", "why"),
        [
            ("evidence.rows[0]", "no key 'rows' at evidence"),
            ("evidence.cells[5]", "out of range"),
            ("evidence.cells[concurrency=1].decode_tps_p50", "matches 2 elements, expected one"),
            ("evidence.cells[nominal_tokens=1]", "matches 0 elements"),
        ],
    )
    def test_a_path_that_leads_nowhere_says_where_it_stops(self, path: str, why: str) -> None:
        with pytest.raises(PathError, match=why.replace("[", r"\[")):
            resolve(self.DATA, path)


class TestCheck:
    def test_every_local_claim_matches_its_verified_bundle(self, tmp_path: Path) -> None:
        result = check_ledger(load_ledger(write(tmp_path)), bundle(tmp_path / "ev"))
        assert result.ok, result.as_dict()
        assert [r.status for r in result.claims] == ["ok", "ok", "ok", "external-prior"]
        first = result.claims[0].recounted
        assert [(e["published"], e["recounted"]) for e in first] == [("112.07", "112.07"), ("2,969", "2,969")]

    def test_a_changed_published_number_differs_naming_both_numbers(self, tmp_path: Path) -> None:
        text = LEDGER.replace('published = "112.07"', 'published = "112.70"')
        result = check_ledger(load_ledger(write(tmp_path, text)), bundle(tmp_path / "ev"))
        assert not result.ok
        differs = [(r.claim, r.status) for r in result.claims if r.status != "ok"]
        assert differs == [
            ("112.07 decode tok/s", "differs"),
            ("roughly 8,100 tok/s prefill", "external-prior"),
        ]
        assert "published 112.70, the evidence says 112.07" in result.claims[0].problems[0]

    def test_a_changed_condition_number_differs_too(self, tmp_path: Path) -> None:
        text = LEDGER.replace('published = "2,969"', 'published = "2,970"')
        result = check_ledger(load_ledger(write(tmp_path, text)), bundle(tmp_path / "ev"))
        assert result.claims[0].status == "differs"

    def test_rounding_is_half_up_to_the_declared_decimals(self, tmp_path: Path) -> None:
        ev = bundle(tmp_path / "ev")

        def ok(published: str) -> bool:
            return check_ledger(
                load_ledger(write(tmp_path, LEDGER.replace("published = 99.8\n", published))), ev
            ).ok

        assert ok('published = "100"\ndecimals = 0\n')  # 99.7949 to 0 decimals
        assert ok('published = "99.79"\n')  # to the 2 decimals it shows
        assert not ok('published = "99.80"\n')
        assert ok('published = "99.80"\ndecimals = 1\n')  # declared: 1 decimal, 99.8

    def test_a_missing_artifact_is_named(self, tmp_path: Path) -> None:
        ev = bundle(tmp_path / "ev")
        (ev / "15-vram_reserve.json").unlink()
        result = check_ledger(load_ledger(write(tmp_path)), ev)
        assert not result.ok and [m.problem for m in result.bundle.mismatches] == ["missing"]
        reserve = result.claims[2]
        assert reserve.status == "missing" and "15-vram_reserve.json" in reserve.problems[0]

    def test_an_edited_artifact_is_not_recounted(self, tmp_path: Path) -> None:
        ev = bundle(tmp_path / "ev")
        path = ev / "13-capacity.json"
        path.write_text(path.read_text().replace("112.0712", "132.0712"))
        result = check_ledger(load_ledger(write(tmp_path)), ev)
        assert not result.ok
        assert result.claims[0].problems == ["13-capacity.json: does not match the bundle's manifest"]

    def test_a_local_claim_may_not_cite_the_sources_external_figures(self, tmp_path: Path) -> None:
        text = LEDGER + (
            '\n[[claims]]\nclaim = "8,100 tok/s prefill"\npublished = "8,100"\n'
            'artifact = "provenance.json"\npath = "external_prior[0].figure"\n'
        )
        result = check_ledger(load_ledger(write(tmp_path, text)), bundle(tmp_path / "ev"))
        assert result.claims[-1].status == "missing"
        assert "external-prior, not a local measurement" in result.claims[-1].problems[0]

    def test_an_artifact_provenance_does_not_list_as_local_is_refused(self, tmp_path: Path) -> None:
        ev = bundle(tmp_path / "ev")
        writer = EvidenceWriter(tmp_path / "ev", "tx-393k", resume=True)
        writer.write_json("decision.json", {"outcome": "verified", "n": 1})
        writer.write_manifest()
        text = (
            LEDGER + '\n[[claims]]\nclaim = "one"\npublished = "1"\nartifact = "decision.json"\npath = "n"\n'
        )
        result = check_ledger(load_ledger(write(tmp_path, text)), ev)
        assert "not a local measurement of this bundle" in result.claims[-1].problems[0]


class TestLedgerFile:
    @pytest.mark.parametrize(
        ("text", "field"),
        [
            (
                '[[claims]]\nclaim = "x"\npublished = "fast"\nartifact = "a"\npath = "p"\n',
                "claims[0].published",
            ),
            ('[[claims]]\nclaim = "x"\npublished = "1"\npath = "p"\n', "claims[0].artifact"),
            ('[[claims]]\nclaim = "x"\norigin = "hearsay"\n', "claims[0].origin"),
            ('[[claims]]\nclaim = "x"\norigin = "external-prior"\n', "claims[0].source"),
            (
                '[[claims]]\nclaim = "x"\npublished = "1"\nartifact = "a"\npath = "p"\ncolour = 1\n',
                "claims[0].colour",
            ),
            ('title = "t"\n', "claims"),
        ],
    )
    def test_a_malformed_claims_file_names_the_file_and_field(
        self, tmp_path: Path, text: str, field: str
    ) -> None:
        with pytest.raises(BadInput) as err:
            load_ledger(write(tmp_path, text))
        assert err.value.data["field"] == field and "claims.toml" in str(err.value)

    def test_an_external_prior_claim_cannot_point_at_local_evidence(self, tmp_path: Path) -> None:
        text = '[[claims]]\nclaim = "x"\norigin = "external-prior"\nsource = "s"\nartifact = "a"\n'
        with pytest.raises(BadInput, match="not recounted from local evidence"):
            load_ledger(write(tmp_path, text))

    def test_render_prints_the_seeds_table_with_external_prior_marked(self, tmp_path: Path) -> None:
        table = render_ledger(load_ledger(write(tmp_path)))
        assert table.splitlines()[2:4] == ["| Public claim | Conditions | Evidence |", "|---|---|---|"]
        rows = table.splitlines()
        assert rows[4] == (
            "| 112.07 decode tok/s | 2,969 prompt tokens; C1; p50 of three "
            "| promotion finding · 13-capacity.json |"
        )
        assert rows[-1] == (
            "| roughly 8,100 tok/s prefill | upstream stable release, native Linux "
            "| external-prior, not measured here: upstream stable release report |"
        )


class TestCli:
    def test_check_exits_0_then_6_after_one_published_number_changes(
        self,
        fake_host: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> None:
        run: Run = in_process(fake_host, monkeypatch, capsys)
        ev = bundle(tmp_path / "ev")
        ledger = write(tmp_path)
        ok = run("claims", "check", str(ledger), "--evidence", str(ev))
        assert ok.code == 0, ok.out + ok.err
        assert "ok: every local claim" in ok.out
        ledger.write_text(LEDGER.replace('published = "2,101"', 'published = "2,543"'))
        bad = run("claims", "check", str(ledger), "--evidence", str(ev))
        assert bad.code == 6
        assert "DIFFERS          2,101 MiB/card free after qualification" in bad.out
        assert (
            "DRIFT: 1 claim(s) do not match the evidence: 2,101 MiB/card free after qualification" in bad.out
        )
        as_json = run("--json", "claims", "check", str(ledger), "--evidence", str(ev))
        assert as_json.code == 6 and as_json.json()["ok"] is False

    def test_a_malformed_file_exits_2_and_render_prints_the_table(
        self,
        fake_host: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> None:
        run: Run = in_process(fake_host, monkeypatch, capsys)
        broken = run("claims", "check", str(write(tmp_path, "claims = 3\n")), "--evidence", str(tmp_path))
        assert broken.code == 2 and "claims.toml: claims: expected" in broken.err
        shown = run("claims", "render", str(write(tmp_path)))
        assert shown.code == 0 and "| Public claim | Conditions | Evidence |" in shown.out
