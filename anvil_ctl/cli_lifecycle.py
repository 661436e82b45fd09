"""Subcommands: promote, rollback, restore, recheck."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from anvil_ctl.commands import lifecycle
from anvil_ctl.commands import recheck as recheck_cmd


def _promote(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    out = lifecycle.promote(
        ctx, slot=a.slot, approved_by=a.approved_by, candidate=a.candidate, dry_run=a.dry_run
    )
    return out, out.exit_code


def _rollback(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    out = lifecycle.rollback(
        ctx,
        slot=a.slot,
        to=getattr(a, "to", None),
        restore_group=a.restore_group,
        dry_run=a.dry_run,
    )
    return out, out.exit_code


def _recheck(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = recheck_cmd.recheck(ctx, a.slot)
    if a.textfile:
        recheck_cmd.write_textfile(Path(a.textfile), result, now=time.time())
    return result, result.exit_code


def register(sub: Any) -> None:
    p = sub.add_parser("promote", help="route the slot to its verified candidate; it becomes the incumbent")
    p.add_argument("candidate", nargs="?", help="container ID prefix, served model or identity digest")
    p.add_argument("--slot", default="primary")
    p.add_argument("--approved-by", required=True, help="the person approving this promotion")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(handler=_promote)

    for name, helptext in (
        ("rollback", "bring a recorded identity back exactly (default: the rollback identity)"),
        ("restore", "bring the recorded incumbent back exactly (rollback's other name)"),
    ):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("--slot", default="primary")
        r.add_argument("--to", help="identity: container ID prefix, identity digest or served model")
        r.add_argument("--restore-group", help="a restore group of the host config; must contain the target")
        r.add_argument("--dry-run", action="store_true")
        r.set_defaults(handler=_rollback)

    c = sub.add_parser("recheck", help="read-only goal-closure assertions (cron); exit 6 on drift")
    c.add_argument("--slot", default="primary")
    c.add_argument("--textfile", help="write node_exporter textfile metrics here (atomically)")
    c.set_defaults(handler=_recheck)
