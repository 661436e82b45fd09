"""Subcommands of the later subsystems: recipes, load, unload."""

from __future__ import annotations

import argparse
from dataclasses import asdict, is_dataclass
from typing import Any

from anvil_ctl.commands import recipes as recipe_cmds
from anvil_ctl.commands import serves


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _recipes_list(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    rows = _plain(recipe_cmds.list_recipes(ctx.settings.recipes_dir))
    if not a.json:
        keep = ("name", "valid", "runnable", "served_model", "context_tokens", "error")
        rows = [{k: r.get(k) for k in keep} for r in rows]
    return rows, 0


def _recipes_show(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return _plain(recipe_cmds.show_recipe(a.recipe, ctx.settings.recipes_dir)), 0


def _recipes_validate(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    host = ctx.config if a.slot else None
    report = recipe_cmds.validate_recipe(
        a.recipe, ctx.settings.recipes_dir, host_config=host, slot_name=a.slot
    )
    return _plain(report), 0


def _recipes_plan(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    plan = recipe_cmds.plan_recipe(
        a.recipe, ctx.settings.recipes_dir, host_config=ctx.config, slot_name=a.slot
    )
    return _plain(plan), 0


def _load(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    out = serves.load(ctx, a.recipe, slot=a.slot, dry_run=a.dry_run)
    return out, out.exit_code


def _unload(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return serves.unload(ctx, a.container_id, yes=a.yes, remove_residue=a.remove_residue), 0


def register(sub: Any) -> None:
    rp = sub.add_parser("recipes", help="pinned serve recipes").add_subparsers(
        dest="recipes_cmd", required=True
    )
    rp.add_parser("list", help="every recipe in the recipes directory").set_defaults(handler=_recipes_list)
    s = rp.add_parser("show", help="one recipe, with its digest")
    s.add_argument("recipe")
    s.set_defaults(handler=_recipes_show)
    v = rp.add_parser("validate", help="check a recipe (exit 2 naming the field)")
    v.add_argument("recipe")
    v.add_argument("--slot", help="also check it fits this slot of the host config")
    v.set_defaults(handler=_recipes_validate)
    p = rp.add_parser("plan", help="the exact container spec `load` would create; touches nothing")
    p.add_argument("recipe")
    p.add_argument("--slot", required=True)
    p.set_defaults(handler=_recipes_plan)

    ld = sub.add_parser("load", help="load a candidate from a recipe; the incumbent is stopped and kept")
    ld.add_argument("recipe")
    ld.add_argument("--slot", required=True)
    ld.add_argument("--dry-run", action="store_true", help="run every guard, print the plan, change nothing")
    ld.set_defaults(handler=_load)

    ul = sub.add_parser("unload", help="remove a candidate container this controller created")
    ul.add_argument("container_id")
    ul.add_argument("--yes", action="store_true", help="really remove it")
    ul.add_argument(
        "--remove-residue",
        action="store_true",
        help="also delete /dev/shm residue, only what two observations agree no process holds",
    )
    ul.set_defaults(handler=_unload)

    from anvil_ctl import cli_gpu, cli_lifecycle, cli_qualify

    cli_qualify.register(sub)
    cli_gpu.register(sub)
    cli_lifecycle.register(sub)
