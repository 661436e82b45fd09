"""Profiles: the shipped ones load; errors name the file and field; overrides select."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.core.errors import BadInput
from anvil_ctl.qualify.gates.capacity import Capacity
from anvil_ctl.qualify.gates.host import LogAudit
from anvil_ctl.qualify.gates.tools import Tools
from anvil_ctl.qualify.profiles import available_profiles, load_profile, resolve_profile


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


class TestShippedProfiles:
    def test_the_named_profiles_exist_and_build(self) -> None:
        assert {"smoke", "full", "seed-qualification", "stub-smoke", "demo"} <= set(available_profiles())
        for name in available_profiles():
            assert load_profile(name).build()

    def test_seed_qualification_mirrors_the_seeds(self) -> None:
        gates = {g.name: g for g in load_profile("seed-qualification").build()}
        tools = gates["tools"]
        assert isinstance(tools, Tools) and tools.count == 20
        capacity = gates["capacity"]
        assert isinstance(capacity, Capacity)
        assert capacity.contexts == [4096, 122880, 235520, 389120] and capacity.repetitions == 3
        assert gates["coding"].thresholds()["visible_tokens"] == 2048
        assert gates["endurance"].thresholds()["requests"] == 60
        assert gates["vram_reserve"].kind == "policy"

    @pytest.mark.parametrize("name", ["full", "seed-qualification", "demo"])
    def test_the_campaign_profiles_end_with_the_bounded_log_audit(self, name: str) -> None:
        last = load_profile(name).build()[-1]
        assert isinstance(last, LogAudit) and last.kind == "functional"
        assert last.max_lines > 0 and last.max_bytes > 0


class TestErrors:
    def test_an_unknown_gate_type_names_file_and_field(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[[gates]]\ntype = "smoke"\n[[gates]]\ntype = "nope"\n')
        with pytest.raises(BadInput) as info:
            load_profile(path)
        assert str(path) in str(info.value) and "gates[1].type" in str(info.value)

    def test_an_unknown_parameter_is_named(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[[gates]]\ntype = "tools"\ncuont = 3\n')
        with pytest.raises(BadInput) as info:
            load_profile(path)
        assert "gates[0].cuont" in str(info.value) and "count" in str(info.value)

    def test_a_wrongly_typed_parameter_is_named(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[[gates]]\ntype = "capacity"\ncontexts = ["4K"]\n')
        with pytest.raises(BadInput) as info:
            load_profile(path)
        assert "gates[0].contexts" in info.value.data["field"]

    def test_duplicate_gate_names_are_refused(self, tmp_path: Path) -> None:
        path = write(tmp_path, '[[gates]]\ntype = "smoke"\n[[gates]]\ntype = "smoke"\n')
        with pytest.raises(BadInput, match=r"gates\[1\]\.name"):
            load_profile(path)

    def test_broken_toml_and_missing_profiles_are_bad_input(self, tmp_path: Path) -> None:
        with pytest.raises(BadInput, match="not valid TOML"):
            load_profile(write(tmp_path, "[[gates]\n"))
        with pytest.raises(BadInput, match="expected one of"):
            load_profile("no-such-profile")


class TestOverrides:
    def test_profile_flag_wins_over_the_recipe_and_gates_select(self) -> None:
        p = resolve_profile("seed-qualification", profile="smoke", gates=["tools", "smoke"])
        assert p.name == "smoke"
        assert [g.name for g in p.gates] == ["smoke", "tools"]

    def test_an_unknown_gate_in_the_override_is_refused(self) -> None:
        with pytest.raises(BadInput, match="not in profile"):
            resolve_profile("smoke", gates=["capacity"])

    def test_without_any_choice_the_smoke_profile_runs(self) -> None:
        assert resolve_profile(None).name == "smoke"
