"""The matched A/B control: boundaries as declared, the comparison and its verdict, both arms
measured on real stub engine processes with configured rates, and the `ab` transaction."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anvil_ctl.commands import evidence as evidence_cmd
from anvil_ctl.commands import qualify as qualify_cmd
from anvil_ctl.commands import transactions
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_RECIPE, LABEL_ROLE, LABEL_SLOT, ContainerSpec
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.plans.args import Candidate
from anvil_ctl.evidence.bundle import verify_bundle
from anvil_ctl.persistence import qualification
from anvil_ctl.qualify.ab import Arm, Boundary, compare, declaration, run_measure
from anvil_ctl.qualify.gates.capacity import Capacity
from anvil_ctl.qualify.profiles import load_profile, parse_profile
from tests.unit.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]
PROTECT = Boundary("prefill_p50", min_delta_pct=-3.0, min_context=16384)


class TestBoundaries:
    def test_a_boundary_reads_as_the_issue_writes_it(self) -> None:
        b = Boundary("prefill_p50", min_delta_pct=-3.0, min_context=122880)
        assert b.describe() == "prefill_p50 >= -3 % at contexts >= 120K"
        assert (b.applies(122880), b.applies(4096)) == (True, False)
        assert (b.holds(-2.8), b.holds(-3.0), b.holds(-3.1), b.holds(None)) == (True, True, False, False)

    def test_the_profile_declares_them_and_the_seeds_control_ships(self) -> None:
        p = load_profile("ab-control")
        assert p.ab_metric == "decode_p50"
        assert [b.describe() for b in p.boundaries] == ["prefill_p50 >= -3 % at contexts >= 120K"]

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            ([{"metric": "speed", "min_delta_pct": 1}], "boundaries[0].metric"),
            ([{"metric": "decode_p50"}], "boundaries[0]"),
            ([{"metric": "decode_p50", "min_delta_pct": "3%"}], "boundaries[0].min_delta_pct"),
            (
                [{"metric": "decode_p50", "min_delta_pct": -3, "min_context": "120K"}],
                "boundaries[0].min_context",
            ),
            ([{"metric": "decode_p50", "min_delta_pct": -3, "colour": 1}], "boundaries[0].colour"),
        ],
    )
    def test_a_malformed_boundary_names_the_file_and_field(self, raw: Any, field: str) -> None:
        with pytest.raises(BadInput) as err:
            parse_profile({"gates": [{"type": "smoke"}], "boundaries": raw}, "p.toml")
        assert err.value.data["field"] == field and "p.toml" in str(err.value)

    def test_the_declaration_digest_covers_the_boundaries(self) -> None:
        arms = [Arm("a", "http://x", "m", {}), Arm("b", "http://y", "m", {})]
        cap = Capacity(contexts=[4096])
        one = declaration(arms, cap, [PROTECT], "decode_p50", "p")
        two = declaration(arms, cap, [Boundary("prefill_p50", min_delta_pct=-5.0)], "decode_p50", "p")
        assert one["digest"] != two["digest"]
        assert one == declaration(arms, cap, [PROTECT], "decode_p50", "p")


def cell(nominal: int, decode: float, prefill: float, *, completed: int = 3) -> dict[str, Any]:
    return {
        "nominal_tokens": nominal,
        "concurrency": 1,
        "decode_tps_p50": decode,
        "prefill_tps_p50": prefill,
        "ttft_s_p50": nominal / prefill,
        "prompt_tokens_p50": nominal * 0.78,
        "completed": completed,
        "requests": 3,
    }


ARMS = [Arm("nospec", "http://a", "m-a", {}), Arm("adaptive", "http://b", "m-b", {})]


class TestCompare:
    def test_the_seeds_control_selects_adaptive_inside_the_3_percent_boundary(self) -> None:
        # The seeds' matched control at 131K: decode +39.7 % / +29.2 %, long prefill -2.8 %.
        cells = {
            "A": [cell(4096, 74.10, 12923), cell(122880, 73.56, 5926)],
            "B": [cell(4096, 103.52, 16728), cell(122880, 95.06, 5759)],
        }
        boundary = Boundary("prefill_p50", min_delta_pct=-3.0, min_context=122880)
        out = compare(ARMS, cells, [boundary], "decode_p50")
        assert [round(c["delta_pct"]["decode_p50"], 1) for c in out["cells"]] == [39.7, 29.2]
        assert round(out["cells"][1]["delta_pct"]["prefill_p50"], 1) == -2.8
        verdict = out["verdict"]
        assert (verdict["outcome"], verdict["selected"]) == ("selected", "adaptive")
        assert "120K/C1 -2.8 %" in verdict["summary"]

    def test_a_violated_boundary_is_named_and_nothing_is_selected(self) -> None:
        cells = {"A": [cell(122880, 74, 5926)], "B": [cell(122880, 95, 5500)]}
        boundary = Boundary("prefill_p50", min_delta_pct=-3.0, min_context=122880)
        verdict = compare(ARMS, cells, [boundary], "decode_p50")["verdict"]
        assert (verdict["outcome"], verdict["selected"], verdict["faster"]) == (
            "boundary-violated",
            None,
            "adaptive",
        )
        assert "prefill_p50 >= -3 % at contexts >= 120K violated (120K/C1 -7.2 %)" in verdict["summary"]

    def test_a_boundary_no_measured_cell_covers_is_violated(self) -> None:
        cells = {"A": [cell(4096, 74, 5926)], "B": [cell(4096, 95, 5926)]}
        boundary = Boundary("prefill_p50", min_delta_pct=-3.0, min_context=122880)
        verdict = compare(ARMS, cells, [boundary], "decode_p50")["verdict"]
        assert verdict["outcome"] == "boundary-violated"
        assert "no measured cell is covered" in verdict["summary"]

    def test_the_boundary_applies_to_whichever_arm_is_faster(self) -> None:
        cells = {"A": [cell(122880, 95, 5000)], "B": [cell(122880, 74, 6000)]}
        verdict = compare(ARMS, cells, [Boundary("prefill_p50", min_delta_pct=-3.0)], "decode_p50")["verdict"]
        assert (verdict["faster"], verdict["outcome"]) == ("nospec", "boundary-violated")

    def test_a_failed_request_in_either_arm_selects_nothing(self) -> None:
        cells = {"A": [cell(4096, 74, 5926)], "B": [cell(4096, 95, 5926, completed=2)]}
        verdict = compare(ARMS, cells, [], "decode_p50")["verdict"]
        assert (verdict["outcome"], verdict["selected"]) == ("incomplete", None)
        assert "adaptive 4K/C1: 1 failed" in verdict["summary"]

    def test_ttft_is_a_metric_where_lower_is_faster(self) -> None:
        cells = {"A": [cell(4096, 74, 5000)], "B": [cell(4096, 74, 6000)]}
        assert compare(ARMS, cells, [], "ttft_p50")["verdict"]["selected"] == "adaptive"


# -- both arms on real stub engine processes -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


StubFactory = Callable[..., str]


def start_stub(port: int, served: str, *flags: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "anvil_stub", "--port", str(port), "--served-model", served, *flags],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.terminate()
    raise AssertionError("stub did not become healthy")


@pytest.fixture
def stubs() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(served: str, *flags: str, port: int | None = None) -> str:
        port = port or _free_port()
        procs.append(start_stub(port, served, "--max-model-len", "32768", "--verbose-default", *flags))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


CELLS = Capacity(contexts=[4096, 16384], concurrency=[1], repetitions=3, output_tokens=48)
# Prefill slow enough (1.6 s at 16K) that scheduling jitter on a busy host stays near 1 %; the
# faster arm's prefill is 2 % above the control's, 5 points inside the -3 % boundary.
CONTROL = ("--prefill-tps", "10000", "--decode-tps", "400")
FASTER = ("--prefill-tps", "10200", "--decode-tps", "560")
COSTLY = ("--prefill-tps", "8000", "--decode-tps", "560")


class TestBothArmsOnStubEngines:
    def test_the_arms_alternate_per_repetition_over_the_same_cells(self, stubs: Callable[..., str]) -> None:
        arms = [Arm("a", stubs("m-a", *CONTROL), "m-a", {}), Arm("b", stubs("m-b", *CONTROL), "m-b", {})]
        measured = run_measure(arms, Capacity(contexts=[4096], repetitions=3, output_tokens=8))
        assert [(o["rep"], o["arm"]) for o in measured["order"]] == [
            (1, "A"),
            (1, "B"),
            (2, "B"),
            (2, "A"),
            (3, "A"),
            (3, "B"),
        ]
        assert [c["requests"] for c in measured["cells"]["A"]] == [3]
        assert [c["requests"] for c in measured["cells"]["B"]] == [3]

    def test_rates_inside_the_boundary_select_the_faster_arm(self, stubs: Callable[..., str]) -> None:
        arms = [
            Arm("nospec", stubs("m-a", *CONTROL), "m-a", {}),
            Arm("adaptive", stubs("m-b", *FASTER), "m-b", {}),
        ]
        out = compare(arms, run_measure(arms, CELLS)["cells"], [PROTECT], "decode_p50")
        assert (out["verdict"]["outcome"], out["verdict"]["selected"]) == ("selected", "adaptive"), out[
            "verdict"
        ]
        assert all(c["delta_pct"]["decode_p50"] > 25 for c in out["cells"])

    def test_an_arm_that_costs_long_prefill_violates_the_declared_boundary(
        self, stubs: Callable[..., str]
    ) -> None:
        arms = [
            Arm("nospec", stubs("m-a", *CONTROL), "m-a", {}),
            Arm("adaptive", stubs("m-b", *COSTLY), "m-b", {}),
        ]
        verdict = compare(arms, run_measure(arms, CELLS)["cells"], [PROTECT], "decode_p50")["verdict"]
        assert (verdict["outcome"], verdict["faster"], verdict["selected"]) == (
            "boundary-violated",
            "adaptive",
            None,
        )
        assert "prefill_p50 >= -3 % at contexts >= 16K violated (16K/C1 -" in verdict["summary"]
        (observed,) = verdict["boundaries"][0]["cells"]
        assert -22 < observed["delta_pct"] < -18  # configured: 8,000 vs 10,000 tok/s


# -- the `ab` transaction on the fake host, arms served by stub processes ------------------------

AB_SLOTS = """
[slots.ab-a]
binding = "127.0.0.1:{pa}"
router_tier = "ab-a-local"
aliases = ["llm.ab-a"]

[slots.ab-b]
binding = "127.0.0.1:{pb}"
router_tier = "ab-b-local"
aliases = ["llm.ab-b"]
"""


def arm_candidate(host: FakeHost, slot: str, port: int, served: str, recipe: str) -> Candidate:
    spec = ContainerSpec(
        name=f"arm-{recipe}",
        image=host.image_id,
        env=(("FAKE_SERVED_MODEL", served), ("FAKE_BINDING", f"127.0.0.1:{port}")),
        labels=(
            (LABEL_MANAGED, "true"),
            (LABEL_RECIPE, recipe),
            (LABEL_ROLE, "candidate"),
            (LABEL_SLOT, slot),
        ),
    )
    return Candidate(
        recipe=recipe,
        recipe_digest="e" * 64,
        served_model=served,
        context_tokens=32768,
        health_path="/health",
        startup_timeout_s=1.0,
        spec=spec,
    )


@pytest.fixture
def ab_host(fake_host: FakeHost, stubs: Callable[..., str]) -> Iterator[tuple[FakeHost, dict[str, Any]]]:
    pa, pb = _free_port(), _free_port()
    with Path(fake_host.settings.config).open("a") as fh:
        fh.write(AB_SLOTS.format(pa=pa, pb=pb))
    arms = {"nospec": ("ab-a", pa, "m-nospec"), "adaptive": ("ab-b", pb, "m-adaptive")}
    for recipe, (slot, port, served) in arms.items():
        out = transactions.load(
            fake_host.app(), slot=slot, candidate=arm_candidate(fake_host, slot, port, served, recipe)
        )
        assert out.state == TxState.COMMITTED, out.reason
    yield fake_host, {"ports": (pa, pb), "start": stubs}


def write_profile(tmp: Path, min_delta: float) -> str:
    path = tmp / "ab-test.toml"
    path.write_text(
        f"""
name = "ab-test"
select = "decode_p50"
[[gates]]
type = "capacity"
contexts = [4096, 16384]
repetitions = 3
output_tokens = 48
[[boundaries]]
metric = "prefill_p50"
min_delta_pct = {min_delta}
min_context = 16384
"""
    )
    return str(path)


class TestTheAbTransaction:
    def test_it_records_the_declaration_before_the_first_request_both_arms_cells_and_the_verdict(
        self, ab_host: tuple[FakeHost, dict[str, Any]], tmp_path: Path
    ) -> None:
        host, env = ab_host
        pa, pb = env["ports"]
        env["start"]("m-nospec", *CONTROL, port=pa)
        env["start"]("m-adaptive", *FASTER, port=pb)
        app = host.app()
        out = qualify_cmd.qualify_ab(
            app, slot="ab-b", arms=("nospec", "adaptive"), profile=write_profile(tmp_path, -3.0)
        )
        assert out.outcome.state == TxState.COMMITTED and out.exit_code == 0, out.outcome.reason
        assert out.comparison is not None
        assert out.comparison["verdict"]["selected"] == "adaptive"
        tx = out.outcome.tx_id or ""
        events = [(e.step, e.event) for e in app.store.step_events(tx) if e.step in ("declare", "measure")]
        assert events[:3] == [("declare", "intent"), ("declare", "result"), ("measure", "intent")]
        declared = json.loads((Path(out.tx_dir or "") / "00-declaration.json").read_text())
        assert out.comparison["declaration_digest"] == declared["digest"]
        assert out.outcome.results["declare"]["digest"] == declared["digest"]
        assert declared["boundaries"][0]["text"] == "prefill_p50 >= -3 % at contexts >= 16K"
        bundle = Path(out.tx_dir or "")
        assert verify_bundle(bundle).ok
        # Bound to the record: the database holds the manifest's hash (not only the files).
        assert [m.kind for m in qualification.manifests(app.store, tx)] == ["ab"]
        bound = evidence_cmd.verify_evidence(app, bundle)
        assert bound.ok and [b.matched for b in bound.bindings or ()] == [True], bound.as_dict()
        assert {p.name for p in bundle.iterdir()} >= {
            "00-declaration.json",
            "01-arm-A-cells.json",
            "02-arm-B-cells.json",
            "03-order.json",
            "ab-comparison.json",
        }
        from anvil_ctl.commands import evidence as report

        page = Path(report.evidence_report(app, tx, tmp_path / "ab.html").path).read_text()
        assert "A/B control: nospec vs adaptive" in page and "SELECTED" in page
        assert "prefill_p50 &gt;= -3 % at contexts &gt;= 16K" in page
        rows = qualification.evidence(app.store, tx)
        assert [(r["gate"], r["passed"], r["classification"]) for r in rows][-1] == (
            "ab-comparison",
            True,
            "selected",
        )

    def test_an_arm_that_is_not_loaded_is_bad_input_naming_it(
        self, ab_host: tuple[FakeHost, dict[str, Any]]
    ) -> None:
        host, _ = ab_host
        with pytest.raises(BadInput, match="--ab mystery: no loaded candidate matches it"):
            qualify_cmd.qualify_ab(host.app(), slot="ab-b", arms=("nospec", "mystery"), profile="ab-stub")

    def test_an_arm_that_stopped_serving_is_refused_before_any_request(
        self, ab_host: tuple[FakeHost, dict[str, Any]]
    ) -> None:
        host, _ = ab_host
        app = host.app()
        cand = app.store.current_identity("ab-a", "candidate")
        assert cand is not None
        with host.world.edit() as w:
            w["containers"][cand.container_id]["status"] = "exited"
        out = qualify_cmd.qualify_ab(app, slot="ab-b", arms=("nospec", "adaptive"), profile="ab-stub")
        assert (out.outcome.state, out.exit_code) == (TxState.REFUSED, 3)
        assert "arm nospec is not what its slot serves" in out.outcome.reason
        assert not (app.settings.evidence_dir / (out.outcome.tx_id or "-")).exists()

    def test_a_profile_without_one_capacity_gate_is_bad_input(
        self, ab_host: tuple[FakeHost, dict[str, Any]]
    ) -> None:
        host, _ = ab_host
        with pytest.raises(BadInput, match="exactly one capacity gate"):
            qualify_cmd.qualify_ab(host.app(), slot="ab-b", arms=("nospec", "adaptive"), profile="smoke")
