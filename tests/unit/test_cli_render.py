"""anvil_ctl.cli.render: the renderer is chosen by the result's type; --json prints one document."""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass

import pytest

from anvil_ctl.cli import render, views
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.engine.outcome import Outcome
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(fake_host, monkeypatch, capsys)


def dry_run_outcome() -> Outcome:
    return Outcome(
        kind="load",
        state=TxState.PLANNED,
        dry_run=True,
        plan=[{"step": "stop-incumbent", "description": "stop and keep it", "undo": "start it"}],
    )


class TestRendererTable:
    def test_every_named_type_exists(self) -> None:
        for name in render.RENDERERS:
            module, _, cls = name.rpartition(".")
            assert inspect.isclass(getattr(importlib.import_module(module), cls)), name

    def test_every_view_has_a_renderer(self) -> None:
        kinds = [c for _, c in inspect.getmembers(views, inspect.isclass) if issubclass(c, views.View)]
        bases = (views.View, views._Data, views._Rows)
        named = {f"{k.__module__}.{k.__qualname__}" for k in kinds if k not in bases}
        assert len(named) >= 8
        assert named - set(render.RENDERERS) == set()

    def test_a_subclass_gets_its_base_types_renderer(self) -> None:
        @dataclass
        class LoudOutcome(Outcome):
            pass

        assert render.renderer_for(LoudOutcome) is render.renderer_for(Outcome)

    def test_an_unknown_type_is_shown_as_key_value_lines_not_json(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        render.show({"b": 1, "a": [1, 2], "c": {"d": None}}, as_json=False)
        assert capsys.readouterr().out == "b: 1\na: 1, 2\nc:\n  d: -\n"


class TestHumanOutput:
    def test_a_dry_run_outcome_prints_its_plan(self, capsys: pytest.CaptureFixture[str]) -> None:
        render.show(dry_run_outcome(), as_json=False)
        out = capsys.readouterr().out
        assert out.startswith("load: dry run, nothing changed\n")
        assert "    - stop-incumbent: stop and keep it (undo: start it)" in out

    def test_a_table_shows_its_columns_after_its_cells(self, capsys: pytest.CaptureFixture[str]) -> None:
        rows = [{"id": "x" * 40, "kept": 1, "dropped": 2}]
        render.show(
            views.Table(rows, columns=("id", "kept"), cells=lambda r: {**r, "id": r["id"][:8]}), False
        )
        out = capsys.readouterr().out
        assert "xxxxxxxx " in out and "x" * 9 not in out and "dropped" not in out
        render.show(views.Table([]), False)
        assert capsys.readouterr().out == "(none)\n"

    def test_recipes_list_shows_the_headline_columns(self, anvilctl: Run) -> None:
        r = anvilctl("recipes", "list")
        assert r.code == ExitCode.OK
        assert "served_model" in r.out and "stub-245k-c1" in r.out and "digest" not in r.out
        assert "digest" in anvilctl("recipes", "list", "--json").json()[0]

    def test_status_names_the_slot_and_its_incumbent(self, anvilctl: Run, fake_host: FakeHost) -> None:
        r = anvilctl("status")
        assert r.code == ExitCode.OK
        assert r.out.startswith("slot primary: 127.0.0.1:8001 serves ")
        assert f"incumbent: {fake_host.incumbent_id[:12]}" in r.out

    def test_gpus_detect_prints_toml(self, anvilctl: Run) -> None:
        r = anvilctl("gpus", "detect")
        assert r.code == ExitCode.OK
        assert r.out.startswith("[gpu_roles.compute-a]\n") and "(pass --write)" in r.out


class TestJsonOutput:
    @pytest.mark.parametrize(
        "args",
        [
            ["status"],
            ["recheck"],
            ["gpus"],
            ["gpus", "detect"],
            ["waivers", "list"],
            ["lock", "status"],
            ["recover"],
            ["recipes", "list"],
            ["recipes", "show", "stub-245k-c1"],
            ["recipes", "validate", "stub-245k-c1", "--slot", "primary"],
            ["recipes", "plan", "stub-245k-c1", "--slot", "primary"],
            ["audit", "verify"],
            ["audit", "transactions"],
            ["completion", "bash"],
        ],
        ids=" ".join,
    )
    def test_json_prints_exactly_one_document(self, anvilctl: Run, args: list[str]) -> None:
        r = anvilctl(*args, "--json")
        assert r.code == ExitCode.OK, r.err
        json.loads(r.out)  # the whole of stdout is one JSON document
        assert r.out.endswith("}\n") or r.out.endswith("]\n") or r.out.endswith('"\n')

    def test_a_result_is_its_as_dict(self) -> None:
        outcome = dry_run_outcome()
        assert json.loads(render.to_json(outcome)) == json.loads(json.dumps(outcome.as_dict()))


FORGED = "op\n\x1b[31mFORGED: approved by cfo\x1b[0m"
CLEAR = "r\x1b[2J"
RLO = "safe\u202eevil"


class TestDisplayThatCannotBeForged:
    """A value that reached the record some other way (an older version, sqlite3 by hand) is
    shown escaped: it cannot start a line of its own or steer the terminal."""

    def _forged_waiver(self, fake_host: FakeHost) -> None:
        from datetime import UTC, datetime

        from anvil_ctl.core.waiver import Waiver
        from anvil_ctl.persistence import waiver_rows

        waiver = Waiver(
            id="wvr-forged00000",
            policy="vram-reserve",
            value=0,
            approved_by=FORGED,
            reason=CLEAR + RLO,
            created_at=datetime.now(UTC),
            roles=frozenset({"compute-a"}),
            recipe_digest=None,
            expires_at=None,
        )
        waiver_rows.add_waiver(fake_host.app().store, waiver)

    def test_waivers_list_shows_control_characters_as_escapes(
        self, anvilctl: Run, fake_host: FakeHost
    ) -> None:
        self._forged_waiver(fake_host)
        r = anvilctl("waivers", "list")
        assert r.code == 0
        assert "\x1b" not in r.out and "\u202e" not in r.out
        assert "\\x1b[31mFORGED" in r.out and "\\x1b[2J" in r.out and "\\u202e" in r.out
        assert not any(line.lstrip("│ ").startswith("\x1b[31mFORGED") for line in r.out.splitlines())
        assert not any(line.strip().startswith("FORGED") for line in r.out.splitlines())

    def test_json_escapes_them_too(self, anvilctl: Run, fake_host: FakeHost) -> None:
        self._forged_waiver(fake_host)
        r = anvilctl("--json", "waivers", "list")
        assert "\x1b" not in r.out and "\u202e" not in r.out
        assert any(w["approved_by"] == FORGED for w in r.json())  # the record itself is kept as it is

    def test_an_outcome_reason_is_one_escaped_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        outcome = Outcome(kind="load", state=TxState.REFUSED, reason=FORGED, tx_id="t1")
        render.show(outcome, as_json=False)
        out = capsys.readouterr().out
        assert "\x1b" not in out and "  reason: op\\n\\x1b[31mFORGED" in out

    def test_an_error_line_is_one_escaped_line(self, anvilctl: Run) -> None:
        r = anvilctl("audit", "show", "x\x1b[2J\u202e")
        assert r.code == ExitCode.BAD_INPUT
        assert r.err.count("\n") == 1 and "\x1b" not in r.err and "\u202e" not in r.err
