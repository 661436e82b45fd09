"""Real commands import only what they use: no `openai` outside promote's acceptance step, no
alembic outside `init`/`db upgrade`, no qualification package outside qualify; `status` and
`recheck` (read-only, run by hand and from cron) no transaction machinery and, on SQLite, no
PostgreSQL dialect.

Each command runs in a fresh interpreter on the fake host (`main`, as the console entry
point calls it), which then reports `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.fakehost import FakeHost

NEVER = ("openai", "alembic", "mako", "anvil_ctl.qualify", "anvil_ctl.acceptance")

# What a read-only command has no use for: the plans, their runner and the host lock (recheck
# imports reconcile only when --repair router runs it), and the PostgreSQL dialect (its drivers'
# modules, ~45 ms) on a SQLite state database (`persistence.models.partial_index`).
READ_ONLY_NEVER = (
    "anvil_ctl.engine.plans",
    "anvil_ctl.engine.runner",
    "anvil_ctl.engine.lock",
    "anvil_ctl.commands.transactions",
    "sqlalchemy.dialects.postgresql",
)

CHILD = """
import json, sys
from anvil_ctl.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded_by(host: FakeHost, *args: str) -> tuple[int, set[str]]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=host.env(), capture_output=True, text=True, timeout=120
    )
    report = json.loads(r.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


def heavy(modules: set[str], never: tuple[str, ...] = NEVER) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in never))


class TestCommandImports:
    @pytest.mark.parametrize(
        "args",
        [
            ("status",),
            ("recheck", "--slot", "primary"),
            ("audit", "transactions", "--limit", "5"),
            ("audit", "verify"),
            ("lock", "status"),
            ("rollback", "--slot", "primary", "--dry-run"),
            ("reconcile", "--slot", "primary", "--dry-run"),
        ],
        ids=" ".join,
    )
    def test_a_command_imports_no_client_no_migrations_and_no_qualification(
        self, fake_host: FakeHost, args: tuple[str, ...]
    ) -> None:
        code, modules = loaded_by(fake_host, *args)
        assert code in (0, 3), code  # a dry run may be refused; what it imported still counts
        assert heavy(modules) == []

    def test_the_check_catches_a_heavy_import(self, fake_host: FakeHost) -> None:
        code, modules = loaded_by(fake_host, "init")
        assert code == 0
        assert "alembic" in heavy(modules)


class TestReadOnlyImports:
    @pytest.mark.parametrize("args", [("status",), ("recheck", "--slot", "primary")], ids=" ".join)
    def test_a_read_only_command_imports_no_transaction_machinery_and_no_postgresql_dialect(
        self, fake_host: FakeHost, args: tuple[str, ...]
    ) -> None:
        code, modules = loaded_by(fake_host, *args)
        assert code == 0
        assert "sqlalchemy.dialects.sqlite" in modules  # it did open the state database
        assert heavy(modules, READ_ONLY_NEVER) == []

    def test_the_check_catches_the_transaction_machinery(self, fake_host: FakeHost) -> None:
        code, modules = loaded_by(fake_host, "reconcile", "--slot", "primary", "--dry-run")
        assert code in (0, 3), code
        assert {"anvil_ctl.engine.plans", "anvil_ctl.engine.lock"} <= set(heavy(modules, READ_ONLY_NEVER))

    def test_the_real_server_probe_loads_the_metrics_parser_only_when_a_gauge_is_read(self) -> None:
        # `status` and every command build the real probe; only a drain reads a gauge.
        probe = (
            "import sys, httpx\n"
            "from anvil_ctl.adapters.engine_http import HttpServerProbe\n"
            "before = 'prometheus_client' in sys.modules\n"
            "ok = httpx.MockTransport(lambda r: httpx.Response(200, text='stub:num_requests_running 2\\n'))\n"
            "n = HttpServerProbe(transport=ok).running('http://127.0.0.1:9', 'stub:num_requests_running')\n"
            "print(before, n, 'prometheus_client' in sys.modules)\n"
        )
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["False", "2", "True"]

    def test_a_promotes_watch_reads_its_profile_without_the_gates_the_ab_or_rich(self) -> None:
        # Every promote's `prepare` imports the watch, which reads the profile's `[watch]`.
        code = "import sys, anvil_ctl.engine.watch; print(sorted(sys.modules))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        never = ("anvil_ctl.qualify.gates", "anvil_ctl.qualify.ab", "anvil_ctl.qualify.client", "rich")
        assert heavy(set(json.loads(r.stdout.replace("'", '"'))), never) == []


WARM = """
import json, sys
from pathlib import Path
from anvil_ctl.bootstrap import App
from anvil_ctl.config.settings import Settings
state_dir, config, backend = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
settings = Settings(state_dir=state_dir, config=config, backend=backend, _env_file=None)
app = App(settings=settings, env={})
if backend == "real":  # the real acceptance, warmed before (and without) any world
    from anvil_ctl.acceptance_worker import RealAcceptance
    from anvil_ctl.adapters.credentials import Secret
    app.__dict__["real_acceptance"] = RealAcceptance("http://127.0.0.1:9", Secret("c", "test"))
app.warm_acceptance()
acceptance = app.real_acceptance if backend == "real" else app.world().acceptance
pid = getattr(acceptance, "_pid", None)
app.close()
import os
try:
    os.kill(pid, 0) if pid else None
    left = bool(pid)
except ProcessLookupError:
    left = False
print(json.dumps(["openai" in sys.modules, "anvil_ctl.acceptance" in sys.modules, bool(pid), left]))
"""


class TestWarmAcceptance:
    def test_a_real_router_gets_its_client_imported_in_a_forked_worker(self, fake_host: FakeHost) -> None:
        s = fake_host.settings
        r = subprocess.run(
            [sys.executable, "-c", WARM, str(s.state_dir), str(s.config), "real"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        # This process never imports the client; the worker was forked, and reaped at close
        # (no world was built: the context closes its acceptance itself).
        assert json.loads(r.stdout) == [False, False, True, False]

    def test_the_fakes_import_nothing_for_it(self, fake_host: FakeHost) -> None:
        s = fake_host.settings
        r = subprocess.run(
            [sys.executable, "-c", WARM, str(s.state_dir), str(s.config), "fake"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == [False, False, False, False]
