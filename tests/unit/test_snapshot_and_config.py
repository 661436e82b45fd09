"""Snapshots are canonical and diffable; the host config says what is wrong and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_ctl.cli.render_tx import change_line
from anvil_ctl.config.host import load_host_config
from anvil_ctl.core.errors import ConfigError
from anvil_ctl.core.snapshot import Snapshot, diff


class TestSnapshot:
    def test_key_order_and_tuples_do_not_change_the_digest(self) -> None:
        a = Snapshot.of({"b": (1, 2), "a": {"y": 1, "x": 2}})
        b = Snapshot.of({"a": {"x": 2, "y": 1}, "b": [1, 2]})
        assert a.sha256 == b.sha256 and a == b

    def test_diff_names_each_change_by_path_and_what_happened(self) -> None:
        a = Snapshot.of({"slots": {"primary": {"containers": {"c1": {"status": "running"}}}}})
        b = Snapshot.of(
            {"slots": {"primary": {"containers": {"c1": {"status": "exited"}, "c2": {"status": "running"}}}}}
        )
        assert [change_line(c.as_dict()) for c in diff(a, b)] == [
            '~ slots.primary.containers.c1.status: "running" -> "exited"',
            '+ slots.primary.containers.c2: {"status": "running"}',
        ]

    def test_equal_snapshots_have_no_diff(self) -> None:
        assert diff(Snapshot.of({"a": 1}), Snapshot.of({"a": 1})) == []


class TestHostConfig:
    def _write(self, tmp_path: Path, text: str) -> Path:
        p = tmp_path / "anvil.toml"
        p.write_text(text)
        return p

    def test_a_bad_uuid_names_the_file_the_key_and_the_expectation(self, tmp_path: Path) -> None:
        p = self._write(tmp_path, '[gpu_roles.compute-a]\nuuid = "0"\ncapacity_mib = 1\n')
        with pytest.raises(ConfigError) as info:
            load_host_config(p)
        msg = str(info.value)
        assert str(p) in msg and "gpu_roles.compute-a.uuid" in msg and "expected a GPU UUID" in msg
        assert info.value.exit_code == 2

    def test_a_public_binding_is_refused_unless_allowed(self, tmp_path: Path) -> None:
        p = self._write(tmp_path, '[slots.s]\nbinding = "0.0.0.0:8001"\nrouter_tier = "t"\naliases = ["a"]\n')
        with pytest.raises(ConfigError, match="not loopback"):
            load_host_config(p)

    def test_a_missing_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="host config not found"):
            load_host_config(tmp_path / "nope.toml")

    def test_unknown_keys_are_refused(self, tmp_path: Path) -> None:
        p = self._write(tmp_path, 'hots = "typo"\n')
        with pytest.raises(ConfigError, match="hots"):
            load_host_config(p)

    def test_the_routers_metrics_url_is_smgs_and_unset_by_default(self, tmp_path: Path) -> None:
        assert load_host_config(self._write(tmp_path, "")).router.metrics_url is None
        url = "http://127.0.0.1:29000/metrics"
        smg = self._write(tmp_path, f'[router]\nkind = "smg"\nmetrics_url = "{url}"\n')
        assert load_host_config(smg).router.metrics_url == url
        haproxy = self._write(tmp_path, f'[router]\nkind = "haproxy"\nmetrics_url = "{url}"\n')
        with pytest.raises(ConfigError, match="metrics_url") as info:
            load_host_config(haproxy)
        assert info.value.exit_code == 2
