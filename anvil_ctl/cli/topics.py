"""`anvilctl help [TOPIC | COMMAND...]`: the manual, rendered from what it describes."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.session import Reply, example
from anvil_ctl.core.states import ALLOWED_TRANSITIONS, UNFINISHED_STATES, WAITING_STATES, ExitCode, TxState

if TYPE_CHECKING:
    from pydantic import BaseModel

EXIT_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.INTERNAL: "internal error: a bug; rerun with --debug and report it",
    ExitCode.BAD_INPUT: "bad input or usage: a file, field or argument is wrong; nothing changed",
    ExitCode.REFUSED: "refused before mutation (a guard, the host lock, router credentials); "
    "only the refusal is recorded",
    ExitCode.COMPENSATED: "a step failed and the transaction compensated back to the before state",
    ExitCode.NEEDS_OPERATOR: "needs an operator: compensation failed, or an interrupted transaction "
    "is unresolved",
    ExitCode.DRIFT: "drift: recheck, audit verify or evidence verify found a difference from the record",
    ExitCode.UNAVAILABLE: "unavailable: a dependency (state database, Docker, NVML, router) is busy, "
    "locked, read-only, full or unreachable; nothing changed, try again",
    ExitCode.HOST_CLAIMED: "host claimed: another machine (machine id) is recorded under this host "
    "name in the state database; nothing changed",
    ExitCode.TARGET_HOLDS_HOST: "db copy refused: the target database already holds this host's "
    "history; nothing written",
    ExitCode.ROLLED_BACK: "a watched promote was rolled back (its watch found a breach, or a person "
    "aborted it); the rollback committed and the old incumbent serves",
}


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=88, initial_indent=indent, subsequent_indent=indent)


def _exit_codes() -> str:
    lines = ["Exit codes of every anvilctl command:", ""]
    lines += [f"  {int(code)}  {EXIT_MEANINGS[code]}" for code in ExitCode]
    lines += ["", "Usage errors print one `anvilctl: error: ...` line on stderr; Ctrl-C exits 130."]
    return "\n".join(lines)


def _states() -> str:
    lines = ["Transaction states and the moves the engine allows (one table in anvil_ctl.core.states):", ""]
    for state in TxState:
        targets = sorted(t.value for f, t in ALLOWED_TRANSITIONS if f == state)
        note = ""
        if state in UNFINISHED_STATES:
            note = "  (unfinished: `anvilctl recover` resolves it)"
        elif state in WAITING_STATES:
            note = "  (waits for a person: `anvilctl resolve`)"
        lines.append(f"  {state.value:<20} -> {', '.join(targets) or '(end)'}{note}")
    return "\n".join(lines)


def _model_fields(model: type[BaseModel], prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Every field of a pydantic model, a nested model as a `[section]` of its own."""
    from pydantic import BaseModel

    lines = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.append(f"  [{prefix}{name}]")
            lines += _model_fields(annotation, f"{prefix}{name}.")
            continue
        default = ""
        if not info.is_required() and info.default_factory is None and info.default is not None:
            default = f" (default {info.default!r})"
        lines.append(f"  {prefix}{name}{default}")
        if info.description:
            lines.append(_wrap(info.description, "      "))
    return lines


def _environment() -> str:
    from anvil_ctl.config.settings import Settings

    lines = ["Settings, from the environment (a flag of the same name wins where there is one):", ""]
    for name, info in Settings.model_fields.items():
        lines.append(f"  ANVIL_{name.upper()}")
        if info.description:
            lines.append(_wrap(info.description, "      "))
    lines += [
        "",
        "Router tokens: ANVIL_ROUTER_ADMIN_TOKEN, ANVIL_ROUTER_CLIENT_TOKEN (names set by the host",
        "config's router.admin_token_env / client_token_env), or its credential_file.",
    ]
    return "\n".join(lines)


def _host_config() -> str:
    from anvil_ctl.config.host import GpuRole, HostConfig, Slot

    lines = ["The host config (anvil.toml), key by key; `[gpu_roles.NAME]` and `[slots.NAME]` repeat:", ""]
    lines += _model_fields(HostConfig, skip=("gpu_roles", "slots"))
    lines += ["  [gpu_roles.NAME]", *_model_fields(GpuRole, "gpu_roles.NAME.")]
    lines += ["  [slots.NAME]", *_model_fields(Slot, "slots.NAME.")]
    return "\n".join(lines)


def _recipe() -> str:
    from anvil_ctl.recipes.model import Recipe

    head = ["A recipe (a TOML file of the recipe search; see `anvilctl help files`), key by key:", ""]
    return "\n".join(head + _model_fields(Recipe))


def _files() -> str:
    from anvil_ctl.places import MIGRATIONS_DIR, RECIPES_DIR, ROOT_CONFIG, ROOT_STATE_DIR, process_defaults

    here = process_defaults()
    return f"""\
Where anvilctl keeps and finds its files. Never relative to the current directory:

  state directory  --state-dir, else ANVIL_STATE_DIR, else
                   {ROOT_STATE_DIR} as root,
                   $XDG_DATA_HOME/anvil (~/.local/share/anvil) otherwise
                   here: {here.state_dir} ({here.why})
                   holds anvil.db (SQLite; or --state-db / ANVIL_STATE_DB, a URL),
                   anvil.lock (the host's one mutator lock), evidence/, anvil.db.head
  host config      --config, else ANVIL_CONFIG, else
                   {ROOT_CONFIG} as root, $XDG_CONFIG_HOME/anvil/anvil.toml otherwise
                   here: {here.config}
  recipes          searched in order, the first file of a name wins:
                   --recipes-dir or ANVIL_RECIPES_DIR; the host config's recipes_dir;
                   the shipped recipes ({RECIPES_DIR})
  migrations       {MIGRATIONS_DIR} (shipped; `anvilctl init` and `db upgrade` run them)

`anvilctl init` and `anvilctl status` print the database and config they used and why."""


OUTPUT = """\
Output:

  -o table (default)  human output; on a terminal tables fit its width (IDs elided in
                      the middle, text wrapped, nothing cut); on a pipe every value in full
  -o wide             every column and every ID in full, whatever the width
  -o json, --json     exactly one JSON document on stdout (status --watch: one per line)

Progress of a transaction goes to stderr: on a terminal its steps as they start and end
with elapsed time and the waits with their deadlines; on a pipe timestamped lines (and a
'still ...' line when a step is quiet for ANVIL_PROGRESS_HEARTBEAT_S); with --json nothing.

Every timestamp is RFC 3339 in UTC with Z: 2026-09-02T12:00:00.123456Z in JSON and the
database, 2026-09-02T12:00:00Z in tables. Times you give (--since, --expires) may carry an
offset; without one they are UTC.

Diffs: + path: value (added), - path: value (removed), ~ path: before -> after (changed);
stored as JSON Patch (RFC 6902) with a test of every value taken away."""


TOPICS: dict[str, tuple[str, Callable[[], str]]] = {
    "exit-codes": ("what each exit status means", _exit_codes),
    "states": ("transaction states and their allowed moves", _states),
    "files": ("where the state, the host config, recipes and migrations are", _files),
    "environment": ("ANVIL_* settings", _environment),
    "host-config": ("anvil.toml, key by key", _host_config),
    "recipe": ("a recipe file, key by key", _recipe),
    "output": ("-o formats, progress, timestamps, diffs", lambda: OUTPUT),
}
"""Every topic of `anvilctl help`, in one place."""


def _index(root: click.Command) -> str:
    lines = ["anvilctl help TOPIC    a topic of the manual:", ""]
    lines += [f"  {name:<13} {about}" for name, (about, _) in TOPICS.items()]
    lines += ["", "anvilctl help COMMAND  a command's help (= anvilctl COMMAND --help):", ""]
    if isinstance(root, click.Group):
        for name, cmd in sorted(root.commands.items()):
            lines.append(f"  {name:<13} {cmd.get_short_help_str(70)}")
    return "\n".join(lines)


@click.command(
    "help",
    epilog=example("anvilctl help exit-codes"),
    context_settings={"ignore_unknown_options": True},
)
@click.argument("words", nargs=-1, metavar="[TOPIC | COMMAND...]")
@click.pass_context
def help_command(click_ctx: click.Context, words: tuple[str, ...]) -> Reply:
    """The manual: a topic (exit-codes, states, files, environment, host-config, recipe, output),
    or a command's help.

    Without a word it lists both.
    """
    from anvil_ctl.cli.views import Text

    root = click_ctx.find_root().command
    if not words:
        return Reply(Text(_index(root)))
    if len(words) == 1 and words[0] in TOPICS:
        return Reply(Text(TOPICS[words[0]][1]()))
    command: click.Command = root
    path = [click_ctx.find_root().info_name or "anvilctl"]
    for word in words:
        sub = command.commands.get(word) if isinstance(command, click.Group) else None
        if sub is None:
            raise click.UsageError(
                f"no help topic or command {' '.join(words)!r}; topics: {', '.join(TOPICS)}", ctx=click_ctx
            )
        command, path = sub, [*path, word]
    with click.Context(command, info_name=" ".join(path), parent=None) as sub_ctx:
        return Reply(Text(command.get_help(sub_ctx)))
