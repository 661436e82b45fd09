"""anvil_ctl.places and the settings built on it: where the state and the host config are when
nobody names them (never relative to the current directory), and where the shipped files are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anvil_ctl import places
from anvil_ctl.config.settings import Settings, setting_origins
from anvil_ctl.places import DefaultPaths, default_paths


class TestDefaultPaths:
    def test_root_gets_the_system_paths(self) -> None:
        found = default_paths({"HOME": "/root", "XDG_DATA_HOME": "/x"}, euid=0)
        assert found == DefaultPaths(Path("/var/lib/anvil"), Path("/etc/anvil/anvil.toml"), "root")

    def test_a_user_gets_the_xdg_directories(self) -> None:
        found = default_paths({"HOME": "/home/u", "XDG_DATA_HOME": "/d", "XDG_CONFIG_HOME": "/c"}, euid=1000)
        assert found == DefaultPaths(Path("/d/anvil"), Path("/c/anvil/anvil.toml"), "XDG")

    def test_unset_or_relative_xdg_variables_fall_back_under_home(self) -> None:
        found = default_paths({"HOME": "/home/u", "XDG_DATA_HOME": "rel/data"}, euid=1000)
        assert found.state_dir == Path("/home/u/.local/share/anvil")
        assert found.config == Path("/home/u/.config/anvil/anvil.toml")


class TestSettingsDefaults:
    @pytest.fixture
    def as_a_user(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        """No ANVIL_* place variables, a non-root user, XDG directories under tmp_path."""
        for name in ("ANVIL_STATE_DIR", "ANVIL_CONFIG", "ANVIL_RECIPES_DIR", "ANVIL_STATE_DB"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        return tmp_path

    def test_two_directories_share_one_database_and_one_lock(
        self, as_a_user: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen = []
        for here in ("one", "two"):
            (as_a_user / here).mkdir()
            monkeypatch.chdir(as_a_user / here)
            s = Settings(_env_file=None)  # type: ignore[call-arg]
            seen.append((s.state_dir, s.db_url, s.lock_path, s.config))
        assert seen[0] == seen[1]
        assert seen[0][2] == as_a_user / "data" / "anvil" / "anvil.lock"
        assert seen[0][3] == as_a_user / "config" / "anvil" / "anvil.toml"
        assert all(p.is_absolute() for p in (seen[0][0], seen[0][2], seen[0][3]))

    def test_a_variable_and_a_flag_override_the_default_and_say_so(self, as_a_user: Path) -> None:
        defaults = default_paths(os.environ, 1000)
        origins = setting_origins({"config": Path("/c.toml")}, {"ANVIL_STATE_DIR": "/s"}, defaults)
        assert origins["config"] == "--config"
        assert origins["state_dir"] == "ANVIL_STATE_DIR"
        assert setting_origins({}, {}, defaults)["state_dir"] == "default (XDG)"


class TestShippedFiles:
    def test_a_checkout_reads_the_repository_folders(self) -> None:
        repo = Path(__file__).resolve().parents[2]
        assert repo / "migrations" == places.MIGRATIONS_DIR
        assert repo / "recipes" == places.RECIPES_DIR
        assert (places.MIGRATIONS_DIR / "env.py").is_file()

    def test_the_wheels_copy_wins_where_it_exists(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        package = tmp_path / "site" / "anvil_ctl"
        (package / "_shipped" / "recipes").mkdir(parents=True)
        monkeypatch.setattr(places, "PACKAGE_DIR", package)
        assert places.shipped_dir("recipes") == package / "_shipped" / "recipes"
        assert places.shipped_dir("migrations") == tmp_path / "site" / "migrations"
        # The stub recipes' `../anvil_stub` mounts resolve beside the installed package.
        assert places.recipe_base(package / "_shipped" / "recipes") == tmp_path / "site" / "recipes"
