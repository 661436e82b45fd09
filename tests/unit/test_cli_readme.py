"""The documentation is executed: every `anvilctl` line of README.md and docs/*.md parses.

Each documented line is dry-parsed by the real click tree (tests/unit/clidocs.py):
a command, option or choice that does not exist fails here, before an operator
copies it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.clidocs import check_document, check_line, command_lines, dry_parse

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


class TestDocumentedCommandLines:
    @pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
    def test_every_documented_command_line_parses(self, doc: Path) -> None:
        assert check_document(doc.read_text()) == []

    def test_the_readme_documents_many_command_lines(self) -> None:
        lines = list(command_lines((REPO / "README.md").read_text()))
        assert len(lines) >= 20
        for documented in ("audit incumbents", "completion bash", "--version", "--state committed"):
            assert any(documented in line for line in lines), documented

    def test_a_bogus_documented_command_fails_the_check(self) -> None:
        planted = (REPO / "README.md").read_text() + "\n```sh\nanvilctl audit nonsense\n```\n"
        problems = check_document(planted)
        assert len(problems) == 1
        assert "No such command 'nonsense'" in problems[0]

    def test_a_bogus_option_inline_or_optional_fails_the_check(self) -> None:
        assert check_document("Run `anvilctl audit transactions --bogus 1` daily.") != []
        assert check_document("`anvilctl qualify --slot primary [--profiles P]`") != []
        assert check_document("`anvilctl audit transactions --state done`") != []


class TestTheLineChecker:
    def test_alternatives_continue_the_group_of_the_first(self) -> None:
        assert check_line("anvilctl audit incumbents | decisions | waivers | rechecks") == []
        assert check_line("anvilctl lock status | lock break ID --by NAME --reason TEXT") == []
        assert check_line("anvilctl audit incumbents | nonsense") != []

    def test_caps_are_placeholders_and_shell_around_the_command_is_ignored(self) -> None:
        line = "ANVIL_STATE_DIR=/x .venv/bin/anvilctl unload CONTAINER --yes >>/var/log/a.log 2>&1 # note"
        assert check_line(line) == []

    def test_prose_naming_anvilctl_is_not_a_command(self) -> None:
        assert check_line("Description=Run anvilctl recheck every 15 minutes") == []

    def test_a_dry_parse_resolves_the_command_path_and_runs_nothing(self) -> None:
        parsed = dry_parse(["audit", "transactions", "--state", "committed", "--kind", "load", "--json"])
        assert parsed.path == ["audit", "transactions"]
