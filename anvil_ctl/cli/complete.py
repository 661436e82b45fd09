"""Shell completion: `anvilctl completion bash|zsh|fish`, and completers for slots, recipes,
transaction IDs and container IDs.

Completers run on every <TAB> and answer nothing rather than fail; they read with tomllib,
a glob and the state database (read-only), never pydantic or Settings.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem, get_completion_class

from anvil_ctl.cli.session import GlobalOptions, Reply, Session, example, settings_from
from anvil_ctl.places import RECIPES_DIR, process_defaults

PROG = "anvilctl"
COMPLETE_VAR = "_ANVILCTL_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def _options(click_ctx: click.Context) -> GlobalOptions:
    session = click_ctx.find_object(Session)
    return session.options if session is not None else GlobalOptions()


def _config_path(click_ctx: click.Context) -> Path:
    return _options(click_ctx).config or Path(os.environ.get("ANVIL_CONFIG") or process_defaults().config)


def _host_config(click_ctx: click.Context) -> dict[str, object]:
    import tomllib  # only when completing: `--help` and every command skip it

    try:
        data = tomllib.loads(_config_path(click_ctx).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def complete_slots(click_ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Slot names of the host config."""
    slots = _host_config(click_ctx).get("slots") or {}
    if not isinstance(slots, dict):
        return []
    return [CompletionItem(name) for name in sorted(slots) if name.startswith(incomplete)]


def recipe_dirs(click_ctx: click.Context) -> list[Path]:
    """The recipe search, as `commands.recipes.recipe_search` orders it."""
    given = _options(click_ctx).recipes_dir or os.environ.get("ANVIL_RECIPES_DIR")
    dirs = [Path(given)] if given else []
    host = _host_config(click_ctx).get("recipes_dir")
    if isinstance(host, str) and host:
        dirs.append(_config_path(click_ctx).parent / host)
    return [*dirs, RECIPES_DIR]


def complete_recipes(
    click_ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Recipe names of the recipe search."""
    names: set[str] = set()
    for directory in recipe_dirs(click_ctx):
        try:
            names.update(p.stem for p in directory.glob("*.toml"))
        except OSError:
            continue
    return [CompletionItem(name) for name in sorted(names) if name.startswith(incomplete)]


def _recorded(
    what: str, click_ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Recorded transaction IDs, or container IDs (12 characters), newest first."""
    try:
        from anvil_ctl.bootstrap import App
        from anvil_ctl.commands.audit import completion_ids

        app = App(settings=settings_from(_options(click_ctx)), env=dict(os.environ))
        found = completion_ids(app, what, incomplete)
    except Exception:  # no database, a locked one, a broken setting: complete nothing
        return []
    if what == "container":
        seen: dict[str, str] = {}
        for cid, about in found:
            seen.setdefault(cid[:12], about)
        return [CompletionItem(cid, help=about) for cid, about in seen.items()]
    return [CompletionItem(tx, help=about) for tx, about in found]


complete_transactions = functools.partial(_recorded, "transaction")
complete_containers = functools.partial(_recorded, "container")


def complete_targets(
    click_ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """`rollback --to`: recorded containers, then transactions."""
    return complete_containers(click_ctx, param, incomplete) + complete_transactions(
        click_ctx, param, incomplete
    )


@click.command(
    "completion",
    epilog=example("anvilctl completion bash > ~/.local/share/bash-completion/completions/anvilctl"),
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(click_ctx: click.Context, shell: str) -> Reply:
    """Print the shell completion script for SHELL: `source <(anvilctl completion bash)`."""
    from anvil_ctl.cli.views import Text

    cls = get_completion_class(shell)
    if cls is None:  # click.Choice already refused it
        raise click.BadParameter(f"no completion for shell {shell!r}", param_hint="SHELL")
    return Reply(Text(cls(click_ctx.find_root().command, {}, PROG, COMPLETE_VAR).source()))
