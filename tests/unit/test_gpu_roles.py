"""Role detection: largest card first, equal cards by canonical UUID, overrides by UUID."""

from __future__ import annotations

import tomllib

import pytest

from anvil_ctl.config.host import HostConfig
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.gpu.naming import assign_role_names, role_name
from anvil_ctl.gpu.roles import detect_roles, render_gpu_roles_toml
from tests.unit.fake_gpus import reading

U1 = "GPU-00000000-0000-0000-0000-00000000000a"
U2 = "GPU-FFFFFFFF-0000-0000-0000-000000000001"  # upper case: sorts after U1 once lowered
U3 = "GPU-11111111-0000-0000-0000-000000000003"


class TestRoleName:
    @pytest.mark.parametrize(
        ("position", "name"),
        [(0, "compute-a"), (1, "compute-b"), (25, "compute-z"), (26, "compute-aa")],
    )
    def test_names_follow_the_alphabet(self, position: int, name: str) -> None:
        assert role_name(position) == name


class TestDetectRoles:
    def test_equal_cards_are_ordered_by_lower_case_uuid_not_index(self) -> None:
        readings = [reading(U2, index=0), reading(U1, index=1)]
        roles = detect_roles(readings)
        assert {n: r.uuid for n, r in roles.items()} == {"compute-a": U1, "compute-b": U2}

    def test_a_change_of_index_order_never_swaps_roles(self) -> None:
        one = detect_roles([reading(U1, index=0), reading(U2, index=1)])
        other = detect_roles([reading(U2, index=0), reading(U1, index=1)])
        assert one == other

    def test_the_largest_card_comes_first(self) -> None:
        roles = detect_roles([reading(U1, total_mib=24_576), reading(U2, total_mib=143_771)])
        assert roles["compute-a"].uuid == U2
        assert roles["compute-a"].capacity_mib == 143_771
        assert roles["compute-b"].uuid == U1

    def test_an_override_names_a_card_and_the_rest_keep_the_sequence(self) -> None:
        readings = [reading(U1), reading(U2), reading(U3)]
        roles = detect_roles(readings, {U1.lower(): "display"})
        assert {n: r.uuid for n, r in roles.items()} == {
            "display": U1,
            "compute-a": U3,
            "compute-b": U2,
        }

    def test_an_override_may_take_a_sequence_name(self) -> None:
        roles = detect_roles([reading(U1), reading(U2)], {U2: "compute-a"})
        assert {n: r.uuid for n, r in roles.items()} == {"compute-a": U2, "compute-b": U1}

    def test_an_override_for_an_absent_gpu_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="no GPU with UUID"):
            detect_roles([reading(U1)], {U3: "compute-x"})

    def test_two_overrides_with_one_name_are_refused(self) -> None:
        with pytest.raises(ConfigError, match="same name"):
            assign_role_names([reading(U1), reading(U2)], {U1: "x", U2: "x"})

    def test_an_invalid_role_name_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="lowercase"):
            detect_roles([reading(U1)], {U1: "Big GPU"})

    def test_a_mig_uuid_cannot_be_a_role(self) -> None:
        with pytest.raises(ConfigError, match="cannot be a role"):
            detect_roles([reading("MIG-0000aaaa-0000-0000-0000-000000000000")])

    def test_detected_roles_carry_the_product_name_and_no_reserve(self) -> None:
        role = detect_roles([reading(U1, name="NVIDIA H200")])["compute-a"]
        assert (role.name, role.reserve_mib) == ("NVIDIA H200", None)


class TestRenderGpuRolesToml:
    def test_the_rendered_tables_load_back_into_the_host_config(self) -> None:
        roles = detect_roles([reading(U1, name='NVIDIA "H200"'), reading(U2)], {U2: "gpu.two"})
        text = render_gpu_roles_toml(roles)
        config = HostConfig.model_validate(tomllib.loads(text))
        assert config.gpu_roles == roles
        assert list(config.gpu_roles) == list(roles)

    def test_a_reserve_is_written_only_when_set(self) -> None:
        role = detect_roles([reading(U1)])["compute-a"]
        assert "reserve_mib" not in render_gpu_roles_toml({"compute-a": role})
        text = render_gpu_roles_toml({"compute-a": role.model_copy(update={"reserve_mib": 0})})
        assert "reserve_mib = 0" in text

    def test_the_text_is_stable(self) -> None:
        roles = detect_roles([reading(U1, name="NVIDIA H200")])
        assert render_gpu_roles_toml(roles) == (
            f'[gpu_roles.compute-a]\nuuid = "{U1}"\ncapacity_mib = 143771\nname = "NVIDIA H200"\n'
        )
