"""The command tree: one table, help on every option, one example per command, closed sets as choices."""

from __future__ import annotations

import click
import pytest

from anvil_ctl.cli import app
from anvil_ctl.cli.app import root
from anvil_ctl.core.states import IDENTITY_ROLES, TX_KINDS, TxState
from anvil_ctl.core.waiver import POLICIES
from anvil_ctl.engine.plans import KINDS
from tests.unit.clidocs import check_line

GLOBAL_OPTIONS = {"--config", "--state-db", "--state-dir", "--json", "--debug"}


def walk(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            out.extend(walk(sub, (*path, name)))
    return out


TREE = walk(root)
IDS = [" ".join(p) or "anvilctl" for p, _ in TREE]


def option(path: str, name: str) -> click.Option:
    command: click.Command = root
    for part in path.split():
        assert isinstance(command, click.Group)
        command = command.commands[part]
    found = next(p for p in command.params if name in p.opts)
    assert isinstance(found, click.Option)
    return found


def choices(path: str, name: str) -> tuple[str, ...]:
    kind = option(path, name).type
    assert isinstance(kind, click.Choice)
    return tuple(kind.choices)


class TestCommandTable:
    def test_the_root_lists_exactly_the_table(self) -> None:
        assert [c.name for c in app.COMMANDS] == list(root.commands)

    def test_the_documented_audit_listings_exist(self) -> None:
        audit = root.commands["audit"]
        assert isinstance(audit, click.Group)
        assert {
            "transactions",
            "show",
            "diff",
            "verify",
            "incumbents",
            "decisions",
            "waivers",
            "rechecks",
        } <= set(audit.commands)

    def test_restore_is_rollback_under_another_name(self) -> None:
        rollback, restore = root.commands["rollback"], root.commands["restore"]
        assert rollback.callback is not restore.callback  # two commands ...
        assert [p.opts for p in rollback.params] == [p.opts for p in restore.params]  # ... one interface


class TestEveryCommand:
    @pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
    def test_every_option_has_help(self, path: tuple[str, ...], command: click.Command) -> None:
        missing = [
            p.opts for p in command.params if isinstance(p, click.Option) and not (p.help or "").strip()
        ]
        assert missing == []

    @pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
    def test_every_command_has_a_summary_and_one_example_that_parses(
        self, path: tuple[str, ...], command: click.Command
    ) -> None:
        assert (command.help or "").strip()
        lines = (command.epilog or "").splitlines()
        examples = [line.strip() for line in lines if line.strip().startswith("anvilctl")]
        assert "Example:" in lines and len(examples) == 1
        assert examples[0].startswith(" ".join(("anvilctl", *path)))
        assert check_line(examples[0]) == []

    @pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
    def test_every_command_takes_the_global_options(
        self, path: tuple[str, ...], command: click.Command
    ) -> None:
        names = {o for p in command.params for o in p.opts}
        assert names >= GLOBAL_OPTIONS


class TestClosedSets:
    def test_transaction_filters_offer_the_states_and_kinds(self) -> None:
        assert choices("audit transactions", "--state") == tuple(s.value for s in TxState)
        assert choices("audit transactions", "--kind") == TX_KINDS

    def test_the_transaction_kinds_are_those_with_a_plan(self) -> None:
        assert set(TX_KINDS) == set(KINDS)

    def test_other_closed_sets(self) -> None:
        assert choices("waive", "--policy") == POLICIES
        assert choices("audit incumbents", "--role") == IDENTITY_ROLES
        shell = next(p for p in root.commands["completion"].params if p.name == "shell")
        assert isinstance(shell.type, click.Choice) and tuple(shell.type.choices) == ("bash", "zsh", "fish")

    def test_open_values_stay_open(self) -> None:
        assert not isinstance(option("recheck", "--slot").type, click.Choice)
        assert not isinstance(option("qualify", "--profile").type, click.Choice)
