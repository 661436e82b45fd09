"""Shell completion: `anvilctl completion bash|zsh|fish`, and completers for slots and recipes.

Completers run on every <TAB>: they read the host config's slot names and the
recipes directory's file names lazily, with tomllib and a glob only (no pydantic,
no Settings), and answer nothing rather than fail when a file is missing or broken.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem, get_completion_class

from anvil_ctl.cli.session import GlobalOptions, Reply, Session, example
from anvil_ctl.cli.views import Text

PROG = "anvilctl"
COMPLETE_VAR = "_ANVILCTL_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def _options(ctx: click.Context) -> GlobalOptions:
    session = ctx.find_object(Session)
    return session.options if session is not None else GlobalOptions()


def complete_slots(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Slot names of the host config (`--config`, else ANVIL_CONFIG, else anvil.toml)."""
    import tomllib  # only when completing: `--help` and every command skip it

    path = _options(ctx).config or Path(os.environ.get("ANVIL_CONFIG") or "anvil.toml")
    try:
        slots = tomllib.loads(path.read_text()).get("slots") or {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    if not isinstance(slots, dict):
        return []
    return [CompletionItem(name) for name in sorted(slots) if name.startswith(incomplete)]


def complete_recipes(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Recipe names of the recipes directory (ANVIL_RECIPES_DIR, else recipes/)."""
    directory = Path(os.environ.get("ANVIL_RECIPES_DIR") or "recipes")
    try:
        names = sorted(p.stem for p in directory.glob("*.toml"))
    except OSError:
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def completion_script(root: click.Command, shell: str) -> str:
    """Click's completion script for `shell`, bound to the `anvilctl` program."""
    cls = get_completion_class(shell)
    if cls is None:  # click.Choice already refused it; kept for callers other than the CLI
        raise click.BadParameter(f"no completion for shell {shell!r}", param_hint="SHELL")
    return cls(root, {}, PROG, COMPLETE_VAR).source()


@click.command(
    "completion",
    epilog=example("anvilctl completion bash > ~/.local/share/bash-completion/completions/anvilctl"),
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> Reply:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    Load it for this shell with `source <(anvilctl completion bash)`.
    """
    return Reply(Text(completion_script(ctx.find_root().command, shell)))
