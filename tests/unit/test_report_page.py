"""The one-page report: built from a real qualification's verified bundle, self-contained (no
external reference of any kind), with its plots, its VRAM readings against the reserve, the
external-prior figures boxed apart; a tampered bundle is refused with exit 6."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from anvil_ctl.core.errors import EvidenceMismatch
from anvil_ctl.evidence.bundle import Bundle, EvidenceWriter, ReportInputs
from anvil_ctl.evidence.report import render_page
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost
from tests.unit.reportbundle import EXTERNAL, GPU_A, qualification_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qualification_bundle(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def page(bundle: Path) -> str:
    return render_page(ReportInputs(Bundle.load(bundle)))


class References(HTMLParser):
    """Every URL-bearing attribute and every CSS url() in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data") and value:
                self.refs.append(value)


def promotion_bundle(root: Path, tx: str = "tx-promote") -> Bundle:
    writer = EvidenceWriter(root, tx)
    writer.write_json(
        "vram-after-acceptance.json",
        {
            "when": "after real-client acceptance",
            "passed": True,
            "cards": [
                {"role": "compute-a", "uuid": GPU_A, "free_mib": 2543, "threshold_mib": 0, "passed": True},
            ],
            "standing_mib": {"compute-a": 3072},
            "waivers": ["w-pair"],
        },
    )
    writer.write_manifest(kind="promotion")
    return Bundle.load(writer.tx_dir, tx)


class TestThePage:
    def test_it_is_one_self_contained_document(self, page: str) -> None:
        refs = References()
        refs.feed(page)
        assert [r for r in refs.refs if not r.startswith("#")] == []
        assert not {"script", "link", "img", "iframe", "object", "embed"} & set(refs.tags)
        assert [u for u in re.findall(r"url\(([^)]*)\)", page) if not u.startswith("#")] == []
        assert "@import" not in page
        assert re.search(r"https?://(?!www\.w3\.org/)", page) is None  # only SVG namespace names

    def test_it_carries_the_three_capacity_plots_and_the_vram_plot_as_inline_svg(self, page: str) -> None:
        assert page.count("<svg") == 2
        for title in ("Time to first token", "Prefill", "Decode", "Free VRAM per card against the reserve"):
            assert title in page
        assert "measured prompt tokens" in page

    def test_it_shows_the_identity_the_decision_its_reasons_and_every_gate(self, page: str) -> None:
        assert "glm53-393k" in page and "stub-393k-c1" in page
        assert "POLICY-INFEASIBLE" in page
        assert "policy gate vram_reserve failed: below_reserve" in page
        for gate in ("served-identity", "smoke", "capacity", "endurance", "vram_reserve", "log_audit"):
            assert f"<td>{gate}</td>" in page

    def test_vram_before_and_after_the_workload_are_read_against_the_standing_reserve(
        self, page: str
    ) -> None:
        assert "before the workload" in page and "after the workload" in page
        assert "standing reserve 3,072 MiB" in page
        assert "<td>compute-a</td><td class=n>3,351</td>" in page
        assert "<td>compute-a</td><td class=n>2,101</td>" in page

    def test_external_prior_figures_are_boxed_apart_and_nowhere_else(self, page: str) -> None:
        box = re.search(r'<div class="box external">.*?</div>', page, re.S)
        assert box is not None and EXTERNAL in box.group(0) and "NOT measured here" in box.group(0)
        assert page.count(EXTERNAL) == 1

    def test_a_promotions_reading_after_acceptance_joins_the_vram_plot_with_the_reserve_in_force(
        self, bundle: Path, tmp_path: Path
    ) -> None:
        html = render_page(ReportInputs(Bundle.load(bundle), promotions=[promotion_bundle(tmp_path)]))
        assert "after acceptance (tx-promo)" in html and "reserve in force 0 MiB" in html
        assert (
            "<td>tx-promo</td><td>compute-a</td><td class=n>2,543</td><td class=n>0</td>"
            "<td>PASS</td><td>w-pair</td>" in html
        )


class TestTamper:
    def test_an_altered_bundle_is_refused_and_nothing_is_written(
        self,
        bundle: Path,
        tmp_path: Path,
        fake_host: FakeHost,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        copy = tmp_path / "copy"
        shutil.copytree(bundle, copy)
        run: Run = in_process(fake_host, monkeypatch, capsys)
        out = tmp_path / "page.html"
        ok = run("evidence", "report", str(copy), "-o", str(out))
        assert ok.code == 0 and out.is_file(), ok.err
        gate = next(copy.glob("*-capacity.json"))
        gate.write_text(gate.read_text().replace('"completed": true', '"completed": false', 1))
        out2 = tmp_path / "page2.html"
        bad = run("evidence", "report", str(copy), "-o", str(out2))
        assert bad.code == 6 and "capacity.json: sha256" in bad.err
        assert not out2.exists()
        with pytest.raises(EvidenceMismatch, match="does not match its manifest"):
            Bundle.load(copy)
