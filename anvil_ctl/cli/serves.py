"""Serves: recipes list|show|validate|plan, load, unload, adopt."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.complete import complete_containers, complete_recipes
from anvil_ctl.cli.options import (
    WAIT_TIMEOUT_HELP,
    accept_drift_options,
    drain_options,
    drift_acceptance,
    dry_run_option,
    slot_option,
    timeout_option,
)
from anvil_ctl.cli.params import CONTEXT_TOKENS, PERSON, RECIPE, REF
from anvil_ctl.cli.session import Lazy, Reply, Session, command, group
from anvil_ctl.core.model import OnDrainTimeout
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.cli import views
    from anvil_ctl.commands import recipes as recipes_cmd
    from anvil_ctl.commands import serves, transactions
else:
    views = Lazy("anvil_ctl.cli.views")
    recipes_cmd = Lazy("anvil_ctl.commands.recipes")
    serves = Lazy("anvil_ctl.commands.serves")
    transactions = Lazy("anvil_ctl.commands.transactions")


ENGINE_NAMES = (
    "llama-cpp-python",
    "llama-cpp-python-cuda",
    "llama-server",
    "openai-compatible",
    "sglang",
    "stub",
    "vllm",
)
"""The engine profiles' names, for `--engine`'s choices: `core.engine_profile` builds its profiles
(and their log patterns) at import, which `--help` need not pay; a test holds the two equal."""

RECIPE_LIST_COLUMNS = ("name", "source", "valid", "runnable", "served_model", "context_tokens", "error")


@command("list", "anvilctl recipes list")
def recipes_list(session: Session) -> Reply:
    """List every recipe and where it came from; an invalid file is listed with its error.

    Searched in --recipes-dir, the host config's recipes_dir, then the shipped recipes; the
    first file of a name wins (--json names the files it shadows)."""
    found = recipes_cmd.list_recipes(recipes_cmd.recipe_search(session.app()))
    return Reply(views.Table(found, columns=RECIPE_LIST_COLUMNS))


@command("show", "anvilctl recipes show stub-393k-c1")
@click.argument("recipe", type=RECIPE, shell_complete=complete_recipes)
def recipes_show(session: Session, recipe: str) -> Reply:
    """One recipe as data, with its digest; RECIPE is a name or a path."""
    app = session.app()
    return Reply(recipes_cmd.show_recipe(recipe, recipes_cmd.recipe_search(app)))


@command("validate", "anvilctl recipes validate stub-393k-c1 --slot primary")
@click.argument("recipe", type=RECIPE, shell_complete=complete_recipes)
@slot_option("Also check that the recipe fits this slot of the host config (port, GPU roles).")
def recipes_validate(session: Session, recipe: str, slot: str | None) -> Reply:
    """Check RECIPE; a bad field exits 2 naming the file and the field."""
    app = session.app()
    host = app.config if slot else None
    found = recipes_cmd.validate_recipe(
        recipe, recipes_cmd.recipe_search(app), host_config=host, slot_name=slot
    )
    return Reply(found)


@command("plan", "anvilctl recipes plan stub-393k-c1 --slot primary")
@click.argument("recipe", type=RECIPE, shell_complete=complete_recipes)
@slot_option("The slot to plan the serve for.", required=True)
def recipes_plan(session: Session, recipe: str, slot: str) -> Reply:
    """The exact container spec `load` would create; touches nothing."""
    app = session.app()
    return Reply(
        recipes_cmd.plan_recipe(
            recipe, recipes_cmd.recipe_search(app), host_config=app.config, slot_name=slot
        )
    )


recipes = group(
    "recipes",
    "Pinned serve recipes (the TOML files of the recipes directory).",
    "anvilctl recipes list",
    recipes_list,
    recipes_show,
    recipes_validate,
    recipes_plan,
)


@command("load", "anvilctl load stub-393k-c1 --slot primary --dry-run")
@click.argument("recipe", type=RECIPE, shell_complete=complete_recipes)
@slot_option("The slot to load into.", required=True)
@dry_run_option()
@timeout_option(WAIT_TIMEOUT_HELP)
@drain_options("abort")
@click.option(
    "--promote",
    "promote_approved_by",
    type=PERSON,
    metavar="APPROVER",
    help="Once loaded, promote the candidate in the same run (every check of `promote`; its "
    "identity needs a standing verified decision), approved by APPROVER: clients wait for "
    "no second command.",
)
@accept_drift_options
def load(
    session: Session,
    *,
    recipe: str,
    slot: str,
    dry_run: bool,
    timeout_s: float | None,
    drain_timeout_s: float | None,
    on_drain_timeout: OnDrainTimeout | None,
    promote_approved_by: str | None,
    accept_drift: bool,
    drift_by: str | None,
    drift_reason: str | None,
) -> Reply:
    """Load a candidate from a recipe; the incumbent is kept.

    Drains the incumbent (new requests get a retryable 503, or on smg with --promote wait up
    to 3 s for the candidate's route; the load waits until its answers
    in flight finish, at most --drain-timeout, else the recipe's drain_timeout_s, else 300 s).
    At the deadline the load gives up, leaving the incumbent routed (exit 3), unless
    --on-drain-timeout cut. Then it stops (never removes) the incumbent, waits for its VRAM,
    starts RECIPE's candidate and waits for its health and served identity. A failed step
    compensates back to the before state (exit 4). The tier stays drained until a promotion
    routes the candidate: --promote APPROVER runs it at once for a candidate qualified before
    (its exit code is the command's; refused, the candidate stays loaded). Killed before
    that promotion commits, `anvilctl recover` runs it, or brings the incumbent back when it is
    refused or fails; `recheck` exits 5 until then."""
    accepted = drift_acceptance(accept_drift, drift_by, drift_reason)
    out = serves.load(
        session.app(),
        recipe,
        slot=slot,
        dry_run=dry_run,
        accept_drift=accepted,
        timeout_s=timeout_s,
        drain_timeout_s=drain_timeout_s,
        on_drain_timeout=on_drain_timeout,
        promote_approved_by=promote_approved_by,
    )
    return Reply(out, ExitCode(out.exit_code))


@command("unload", "anvilctl unload 3f2a9c1b7d4e --yes")
@click.argument("container_id", type=REF, shell_complete=complete_containers)
@click.option("--yes", is_flag=True, help="Really remove it (without: show what would be removed).")
@click.option(
    "--remove-residue",
    is_flag=True,
    help="Also delete /dev/shm residue: only what two observations agree no process holds.",
)
@drain_options("abort")
def unload(
    session: Session,
    *,
    container_id: str,
    yes: bool,
    remove_residue: bool,
    drain_timeout_s: float | None,
    on_drain_timeout: OnDrainTimeout | None,
) -> Reply:
    """Remove a candidate container that anvilctl created.

    CONTAINER_ID must carry anvilctl's candidate labels and be no slot's incumbent or rollback
    identity; without --yes nothing is removed. A running candidate is drained first."""
    out = serves.unload(
        session.app(),
        container_id,
        yes=yes,
        remove_residue=remove_residue,
        drain_timeout_s=drain_timeout_s,
        on_drain_timeout=on_drain_timeout,
    )
    if isinstance(out, dict):  # without --yes: what would be removed
        return Reply(out)
    return Reply(out, ExitCode(out.exit_code))


@command("adopt", "anvilctl adopt 3f2a9c1b7d4e --slot primary --context-tokens 524288")
@click.argument("container_id", type=REF)
@slot_option("The slot the container serves.", required=True)
@click.option(
    "--context-tokens",
    type=CONTEXT_TOKENS,
    required=True,
    help="The context length the container serves, in tokens.",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="The engine profile to probe it with (default: openai-compatible).",
)
@dry_run_option("Inspect and print the plan; record nothing.")
def adopt(
    session: Session, container_id: str, *, slot: str, context_tokens: int, engine: str | None, dry_run: bool
) -> Reply:
    """Record the container serving a slot as its incumbent.

    CONTAINER_ID must be running and the slot's binding serve one model; its context length is
    checked the way the engine profile says before anything is recorded."""
    out = transactions.adopt(
        session.app(),
        slot=slot,
        container_id=container_id,
        context_tokens=context_tokens,
        dry_run=dry_run,
        engine=engine or "",
    )
    return Reply(out, ExitCode(out.exit_code))
