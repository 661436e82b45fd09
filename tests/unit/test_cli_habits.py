"""Operator habits (issue 14, item 5): --version, help topics, revision history and
`rollback --to REVISION|TX`, --timeout, `status --watch`, one timestamp format, waivers
that say whether they expire, `-o json|wide`, human output that is not JSON, completion
of recorded IDs, tables that fit the terminal."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from anvil_ctl.cli.output import layout, show_time
from anvil_ctl.core.states import ExitCode
from tests.unit.clirun import REPO, Run, child, in_process
from tests.unit.fakehost import FakeHost
from tests.unit.test_cli_progress import fake_recipe

RFC3339_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setenv("ANVIL_RECIPES_DIR", str(fake_recipe(fake_host)))
    return in_process(fake_host, monkeypatch, capsys)


def ok(run: Run, *args: str) -> Any:
    r = run(*args, "--json")
    assert r.code == ExitCode.OK, (args, r.out, r.err)
    return r.json()


def timestamps(data: Any) -> list[str]:
    """Every value of a key ending in `_at` anywhere in `data`."""
    found: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if k.endswith("_at") and isinstance(v, str):
                found.append(v)
            else:
                found += timestamps(v)
    elif isinstance(data, list):
        for v in data:
            found += timestamps(v)
    return found


class TestVersionAndHelp:
    def test_version_prints_the_package_version(self, anvilctl: Run) -> None:
        r = anvilctl("--version")
        assert r.code == 0 and re.fullmatch(r"anvilctl \d+\.\d+\.\d+\S*\n", r.out), r.out

    def test_help_topic_exit_codes_names_the_unavailable_code(self, anvilctl: Run) -> None:
        r = anvilctl("help", "exit-codes")
        assert r.code == 0
        assert re.search(r"^\s*7\b.*unavailable", r.out, re.M | re.I), r.out

    def test_help_command_is_the_commands_help_with_its_example(self, anvilctl: Run) -> None:
        r = anvilctl("help", "rollback")
        assert r.code == 0 and "--to REVISION|TX|CONTAINER" in r.out and "Example:" in r.out

    def test_an_unknown_topic_is_a_usage_error(self, anvilctl: Run) -> None:
        assert anvilctl("help", "nonsense").code == ExitCode.BAD_INPUT


class TestRevisionHistory:
    def test_history_numbers_the_slots_revisions_and_rollback_to_a_revision_restores_it(
        self, anvilctl: Run, fake_host: FakeHost
    ) -> None:
        assert ok(anvilctl, "load", "fake-393k", "--slot", "primary")["state"] == "committed"
        history = ok(anvilctl, "audit", "history", "--slot", "primary")
        assert [(h["revision"], h["kind"]) for h in history] == [(1, "adopt"), (2, "load")]
        assert history[0]["serve"]["container_id"] == fake_host.incumbent_id
        assert history[1]["serve"]["served_model"] == "cand-393k"

        assert ok(anvilctl, "rollback", "--slot", "primary", "--to", "1")["state"] == "committed"
        history = ok(anvilctl, "audit", "history", "--slot", "primary")
        assert [h["revision"] for h in history] == [1, 2, 3]
        assert history[2]["serve"]["container_id"] == fake_host.incumbent_id

    def test_rollback_to_a_transaction_prefix_brings_back_the_serve_it_left(
        self, anvilctl: Run, fake_host: FakeHost
    ) -> None:
        adopt_tx = ok(anvilctl, "audit", "history", "--slot", "primary")[0]["tx_id"]
        ok(anvilctl, "load", "fake-393k", "--slot", "primary")
        assert ok(anvilctl, "rollback", "--slot", "primary", "--to", adopt_tx[:8])["state"] == "committed"
        status = json.dumps(ok(anvilctl, "status"))
        assert fake_host.incumbent_id in status

    def test_a_revision_that_does_not_exist_exits_2(self, anvilctl: Run) -> None:
        r = anvilctl("rollback", "--slot", "primary", "--to", "9")
        assert r.code == ExitCode.BAD_INPUT and "9" in r.err


class TestWaiverExpiry:
    WAIVE = ("waive", "--policy", "vram-reserve", "--scope", "compute-a", "--value", "0")
    BY = ("--approved-by", "alice", "--reason", "model-only pair")

    def test_neither_expires_nor_no_expiry_is_a_usage_error_that_changes_nothing(self, anvilctl: Run) -> None:
        r = anvilctl(*self.WAIVE, *self.BY)
        assert r.code == ExitCode.BAD_INPUT and "--expires" in r.err and "--no-expiry" in r.err
        assert ok(anvilctl, "waivers", "list") == []

    def test_both_is_a_usage_error(self, anvilctl: Run) -> None:
        r = anvilctl(*self.WAIVE, *self.BY, "--expires", "2030-01-01", "--no-expiry")
        assert r.code == ExitCode.BAD_INPUT

    @pytest.mark.parametrize(
        ("flags", "expires_at", "expiry"),
        [
            (("--expires", "2030-01-01"), "2030-01-01T00:00:00.000000Z", "explicit"),
            (("--no-expiry",), None, "none (--no-expiry)"),
        ],
    )
    def test_the_audit_record_says_which(
        self, anvilctl: Run, fake_host: FakeHost, flags: tuple[str, ...], expires_at: str | None, expiry: str
    ) -> None:
        ok(anvilctl, *self.WAIVE, *self.BY, *flags)
        (waiver,) = ok(anvilctl, "waivers", "list")
        assert waiver["expires_at"] == expires_at
        with sqlite3.connect(fake_host.settings.state_dir / "anvil.db") as db:
            rows = [json.loads(r[0]) for r in db.execute("SELECT payload_json FROM audit_journal")]
        recorded = [r for r in rows if r.get("expiry")]
        assert recorded and recorded[-1]["expiry"] == expiry and recorded[-1]["expires_at"] == expires_at


class TestOutputFormats:
    def test_o_json_is_the_same_document_as_json(self, anvilctl: Run) -> None:
        a = anvilctl("-o", "json", "audit", "transactions")
        b = anvilctl("audit", "transactions", "--json")
        assert a.code == b.code == 0 and json.loads(a.out) == json.loads(b.out)

    def test_without_json_the_results_are_not_json(self, anvilctl: Run, fake_host: FakeHost) -> None:
        tx = ok(anvilctl, "load", "fake-393k", "--slot", "primary")["tx_id"]
        for args in (("audit", "verify"), ("audit", "show", tx), ("init",), ("recipes", "list")):
            r = anvilctl(*args)
            assert r.code == 0, (args, r.err)
            assert not r.out.lstrip().startswith(("{", "[")), (args, r.out[:200])

    def test_audit_show_is_a_timeline_of_steps_with_outcomes(self, anvilctl: Run) -> None:
        tx = ok(anvilctl, "load", "fake-393k", "--slot", "primary")["tx_id"]
        out = anvilctl("audit", "show", tx).out
        assert out.startswith(f"transaction {tx}: load on slot primary, committed")
        assert re.search(r"^  \S+Z  \[1\] drain-tier: done in \d+\.\d s", out, re.M), out
        assert re.search(r"^  \S+Z  state committed$", out, re.M), out

    def test_every_recorded_time_is_rfc3339_utc_with_z(self, anvilctl: Run) -> None:
        ok(anvilctl, "load", "fake-393k", "--slot", "primary")
        ok(anvilctl, *TestWaiverExpiry.WAIVE, *TestWaiverExpiry.BY, "--expires", "2030-01-01T12:00:00+02:00")
        found = [
            *timestamps(ok(anvilctl, "audit", "transactions")),
            *timestamps(ok(anvilctl, "audit", "history", "--slot", "primary")),
            *timestamps(ok(anvilctl, "waivers", "list")),
            *timestamps(ok(anvilctl, "audit", "incumbents")),
        ]
        assert len(found) >= 8
        assert all(RFC3339_Z.match(t) for t in found), [t for t in found if not RFC3339_Z.match(t)]
        assert "2030-01-01T10:00:00.000000Z" in found  # +02:00 stored as UTC


class TestStatusWatch:
    def test_on_a_pipe_each_observation_follows_a_timestamped_line(self, fake_host: FakeHost) -> None:
        r = child("status", "--watch", "--count", "2", "--interval", "0.1s", env=fake_host.env())
        assert r.code == 0, r.err
        heads = re.findall(r"^--- (\S+)$", r.out, re.M)
        assert len(heads) == 2 and all(RFC3339_Z.match(h) for h in heads)
        assert r.out.count("slot primary:") == 2

    def test_with_json_each_observation_is_one_line(self, fake_host: FakeHost) -> None:
        r = child("status", "--watch", "--count", "2", "--interval", "0.1s", "--json", env=fake_host.env())
        assert r.code == 0, r.err
        docs = [json.loads(line) for line in r.out.splitlines()]
        assert len(docs) == 2 and all("slots" in d for d in docs)

    def test_count_without_watch_is_a_usage_error(self, fake_host: FakeHost) -> None:
        assert child("status", "--count", "2", env=fake_host.env()).code == ExitCode.BAD_INPUT


class TestTimeout:
    def test_timeout_bounds_the_waits_of_a_load(self, fake_host: FakeHost) -> None:
        env = fake_host.env() | {"ANVIL_RECIPES_DIR": str(fake_recipe(fake_host))}
        r = child("load", "fake-393k", "--slot", "primary", "--timeout", "2s", env=env)
        assert r.code == 0, r.err
        # The recipe's health deadline is 5 s; --timeout makes it 2 s.
        assert "to serve cand-393k (deadline 2 s)" in r.err, r.err

    def test_a_timeout_that_is_not_a_duration_exits_2(self, fake_host: FakeHost) -> None:
        r = child("load", "fake-393k", "--slot", "primary", "--timeout", "soon", env=fake_host.env())
        assert r.code == ExitCode.BAD_INPUT and "--timeout" in r.err


class TestIdCompletion:
    def test_transaction_ids_of_the_state_database_are_offered(self, fake_host: FakeHost) -> None:
        env = {**fake_host.env(), "_ANVILCTL_COMPLETE": "bash_complete", "COMP_WORDS": "anvilctl audit show "}
        r = subprocess.run(
            [sys.executable, "-m", "anvil_ctl"],
            env={**env, "COMP_CWORD": "3"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        offered = [line.split(",", 1)[1] for line in r.stdout.splitlines() if line]
        with sqlite3.connect(fake_host.settings.state_dir / "anvil.db") as db:
            (adopt_tx,) = db.execute("SELECT id FROM transactions").fetchone()
        assert adopt_tx in offered, (offered, r.stderr)


class TestTables:
    COLUMNS = ("tx_id", "kind", "state", "created_at")
    ROWS = (
        ("d67d6124-b6bf-4101-931a-6b67fb2748db", "rollback", "committed", "2026-11-30T16:44:08.694390Z"),
        ("100f3f4d-f2e8-4428-9ea3-0abf924aba37", "load", "committed", "2026-11-30T16:44:05+00:00"),
    )

    def test_times_are_shown_to_the_second_with_z(self) -> None:
        assert show_time("2026-11-30T16:44:05+00:00") == "2026-11-30T16:44:05Z"
        assert show_time("2026-11-30T16:44:05.123Z") == "2026-11-30T16:44:05Z"

    def test_a_narrow_terminal_elides_the_middle_of_ids_keeping_the_prefix(self) -> None:
        lines = layout(self.COLUMNS, self.ROWS, width=60)
        assert all(len(line) <= 60 for line in lines), lines
        assert "d67d6124" in lines[1] and "…" in lines[1] and "48db" in lines[1]
        assert "2026-11-30T16:44:08Z" in lines[1]  # times are never cut

    def test_a_digest_keeps_its_hex_prefix_and_drops_sha256_only_last(self) -> None:
        from anvil_ctl.cli.output import elide_middle

        digest = "sha256:0cceb25d172d3abcdea8bf43db0b0a7dd7479f02e544dbe429f2bdee3af3eb53"
        assert elide_middle(digest, 20) == "sha256:0cceb25d…eb53"
        assert elide_middle(digest, 16) == "sha256:0cceb25d…"
        assert elide_middle(digest, 9) == "0cceb25d…"

    def test_wide_or_no_width_prints_every_id_in_full(self) -> None:
        for lines in (
            layout(self.COLUMNS, self.ROWS, width=None),
            layout(self.COLUMNS, self.ROWS, width=60, wide=True),
        ):
            assert "d67d6124-b6bf-4101-931a-6b67fb2748db" in lines[1]

    def test_a_terminal_of_100_columns_gets_a_table_that_fits(self, fake_host: FakeHost) -> None:
        import pty

        env = fake_host.env() | {"COLUMNS": "100", "TERM": "dumb"}
        master, slave = pty.openpty()
        with subprocess.Popen(
            [sys.executable, "-m", "anvil_ctl", "audit", "incumbents"],
            cwd=REPO,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
        ) as proc:
            os.close(slave)
            seen = bytearray()
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen.extend(chunk)
            proc.wait(timeout=60)
        os.close(master)
        text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", seen.decode()).replace("\r", "")
        assert proc.returncode == 0, text
        lines = [line for line in text.splitlines() if line]
        assert lines and all(len(line) <= 100 for line in lines), lines
        assert fake_host.incumbent_id[:8] in text
