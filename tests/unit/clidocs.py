"""Check documented `anvilctl` command lines against the real click tree, running nothing.

`check_document(markdown)` finds every `anvilctl ...` line (fenced blocks of any
language, and inline code spans), expands `A | B` alternatives, drops `[optional]`
parts (checking that the options they name exist), substitutes CAPS placeholders
and dry-parses each line with a copy of the command tree whose callbacks do
nothing. It returns one problem per line that does not parse.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

import click

from anvil_ctl.cli.app import root

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
OPTIONAL = re.compile(r"\[([^\]]*)\]")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`(anvilctl [^`]+)`(?!`)")
SHELL_STOP = ("&&", "||", ";")
DUMMY = "placeholder"
MARK = "__optional"
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass
class Parsed:
    """The command path a line resolved to (e.g. ['audit', 'transactions']) and its leaf."""

    path: list[str] = field(default_factory=list)
    command: click.Command | None = None


def _dry_tree() -> click.Group:
    """A copy of the root whose command callbacks record the path they were reached by."""
    tree = copy.deepcopy(root)

    def stub(command: click.Command) -> None:
        def record(**_params: object) -> None:
            click_ctx = click.get_current_context()
            parsed = click_ctx.find_object(Parsed)
            if parsed is not None and (click_ctx.invoked_subcommand is None or not parsed.path):
                parsed.path = click_ctx.command_path.split()[1:]
                parsed.command = click_ctx.command

        command.callback = record
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                stub(sub)

    stub(tree)
    return tree


DRY = _dry_tree()


def dry_parse(argv: list[str]) -> Parsed:
    """Parse argv as `anvilctl` would and invoke nothing; click.UsageError when it is wrong."""
    parsed = Parsed()
    DRY.main(args=list(argv), prog_name="anvilctl", standalone_mode=False, obj=parsed)
    return parsed


def command_lines(markdown: str) -> Iterator[str]:
    """Every `anvilctl ...` command line of a Markdown document, as written."""
    for block in FENCE.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            if re.search(r"(^|[\s=/])anvilctl(\s|$)", line):
                yield line.strip()
    for span in INLINE.findall(markdown):
        yield span.strip()


def _tokens_after_anvilctl(line: str) -> list[str] | None:
    """The arguments `anvilctl` is run with on this line; None when it is only named (prose).

    It is run where it starts a shell command (after `VAR=value` assignments) or where
    a path to it is given (`.venv/bin/anvilctl`, `ExecStart=/opt/anvil/.venv/bin/anvilctl`).
    """
    tokens = shlex.split(line, comments=True)
    starts_command = True
    for i, tok in enumerate(tokens):
        if tok.endswith("/anvilctl") or (starts_command and tok == "anvilctl"):
            rest = []
            for t in tokens[i + 1 :]:
                if t in SHELL_STOP or t.startswith((">", "2>", "<")):
                    break
                rest.append(t)
            return rest
        starts_command = tok in SHELL_STOP or (starts_command and ASSIGNMENT.match(tok) is not None)
    return None


def _substitute(tokens: list[str]) -> list[str]:
    return [DUMMY if PLACEHOLDER.match(t) else t for t in tokens]


def _alternatives(tokens: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for t in tokens:
        if t == "|":
            out.append([])
        else:
            out[-1].append(t)
    return out


def _option_names(command: click.Command) -> set[str]:
    return {name for p in command.params for name in (*p.opts, *p.secondary_opts)}


def _prefix_for(alternative: list[str], path: list[str]) -> list[str] | None:
    """The group path an alternative continues: `show TX` after `audit transactions` -> audit."""
    for depth in range(len(path), -1, -1):
        group: click.Command = root
        for name in path[:depth]:
            assert isinstance(group, click.Group)
            group = group.commands[name]
        if isinstance(group, click.Group) and alternative and alternative[0] in group.commands:
            return path[:depth]
    return None


def check_line(line: str) -> list[str]:
    """Problems of one documented line (empty: every alternative in it parses)."""
    optional: list[str] = []

    def mark(m: re.Match[str]) -> str:
        optional.append(m.group(1))
        return f" {MARK}{len(optional) - 1} "

    tokens = _tokens_after_anvilctl(OPTIONAL.sub(mark, line))
    if tokens is None:
        return []
    problems: list[str] = []
    path: list[str] = []
    for n, alternative in enumerate(_alternatives(_substitute(tokens))):
        parts = [optional[int(t[len(MARK) :])] for t in alternative if t.startswith(MARK)]
        argv = [t for t in alternative if not t.startswith(MARK)]
        if n > 0:
            prefix = _prefix_for(argv, path)
            if prefix is None:
                problems.append(f"{line!r}: alternative {' '.join(argv)!r} names no command")
                continue
            argv = [*prefix, *argv]
        try:
            parsed = dry_parse(argv)
        except click.UsageError as exc:
            problems.append(f"{line!r}: `anvilctl {' '.join(argv)}`: {exc.format_message()}")
            continue
        if n == 0:
            path = parsed.path
        known = _option_names(parsed.command) if parsed.command is not None else set()
        for word in (w for part in parts for w in part.split()):
            if word.startswith("--") and word not in known:
                problems.append(f"{line!r}: `anvilctl {' '.join(parsed.path)}` has no option {word}")
    return problems


def check_document(markdown: str) -> list[str]:
    return [p for line in command_lines(markdown) for p in check_line(line)]
