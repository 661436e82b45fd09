"""Subcommand definitions: each adds its parser and a handler returning (result, exit code)."""

from __future__ import annotations

import argparse
from typing import Any

from anvil_ctl.commands import admin, audit, transactions


def _outcome(outcome: Any) -> tuple[Any, int]:
    return outcome, outcome.exit_code


def _init(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = admin.init(ctx)
    if getattr(a, "detect_gpus", False):
        from anvil_ctl import cli_gpu

        result["gpu_roles"] = cli_gpu.detect_from_args(a, ctx, write=True)
    return result, 0


def _status(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return admin.status(ctx), 0


def _recover(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    report = transactions.recover_all(ctx)
    return report, report.exit_code


def _resolve(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return transactions.resolve(ctx, a.tx, by=a.by, note=a.note), 0


def _lock_status(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return transactions.lock_status(ctx), 0


def _lock_break(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return transactions.lock_break(ctx, a.lock_id, by=a.by, reason=a.reason), 0


def _audit_tx(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return audit.transactions(ctx, kind=a.kind, state=a.state, since=a.since, limit=a.limit), 0


def _audit_show(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return audit.show(ctx, a.tx), 0


def _audit_diff(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return audit.diff(ctx, a.tx), 0


def _audit_verify(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = audit.verify(ctx)
    return result, 0 if result["ok"] else 6


def _audit_incumbents(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return audit.identities(ctx, slot=a.slot, role=a.role), 0


def _audit_rechecks(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return audit.rechecks(ctx, slot=a.slot, limit=a.limit), 0


def _audit_decisions(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    rows = audit.decisions(ctx, slot=a.slot)
    if not a.json:
        keep = (
            "id",
            "slot",
            "outcome",
            "profile",
            "reclassifies",
            "waiver_ids",
            "container_id",
            "at",
        )
        rows = [
            {
                k: (str(r[k])[:16] if k in ("id", "reclassifies", "container_id") and r[k] else r[k])
                for k in keep
            }
            for r in rows
        ]
    return rows, 0


def _adopt(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return _outcome(
        transactions.adopt(
            ctx,
            slot=a.slot,
            container_id=a.container_id,
            context_tokens=a.context_tokens,
            dry_run=a.dry_run,
        )
    )


def register(sub: Any) -> None:
    p = sub.add_parser("init", help="create or upgrade the state database")
    p.add_argument(
        "--detect-gpus",
        action="store_true",
        help="probe NVML and write [gpu_roles.*] into the host config",
    )
    from anvil_ctl import cli_gpu

    cli_gpu.add_detect_arguments(p)
    p.set_defaults(handler=_init)

    db = sub.add_parser("db", help="state database maintenance").add_subparsers(dest="db_cmd", required=True)
    db.add_parser("upgrade", help="run migrations to head").set_defaults(handler=_init)

    sub.add_parser("status", help="slots, incumbents, candidates, health").set_defaults(handler=_status)
    sub.add_parser("recover", help="compensate transactions whose owner died").set_defaults(handler=_recover)
    rs = sub.add_parser("resolve", help="record that a person resolved a needs-operator transaction")
    rs.add_argument("tx")
    rs.add_argument("--by", required=True, help="who resolved it")
    rs.add_argument("--note", required=True, help="what they did")
    rs.set_defaults(handler=_resolve)

    lock = sub.add_parser("lock", help="the host mutator lock").add_subparsers(dest="lock_cmd", required=True)
    lock.add_parser("status", help="who holds the lock").set_defaults(handler=_lock_status)
    lb = lock.add_parser("break", help="release a dead owner's lock row by its ID (journaled)")
    lb.add_argument("lock_id")
    lb.add_argument("--by", required=True, help="who breaks it")
    lb.add_argument("--reason", required=True)
    lb.set_defaults(handler=_lock_break)

    au = sub.add_parser("audit", help="read the state database").add_subparsers(
        dest="audit_cmd", required=True
    )
    t = au.add_parser("transactions", help="list transactions")
    t.add_argument("--kind")
    t.add_argument("--state")
    t.add_argument("--since", help="ISO-8601 UTC time, e.g. 2026-09-02T00:00:00Z")
    t.add_argument("--limit", type=int, default=50)
    t.set_defaults(handler=_audit_tx)
    s = au.add_parser("show", help="one transaction: states, steps, snapshots")
    s.add_argument("tx")
    s.set_defaults(handler=_audit_show)
    d = au.add_parser("diff", help="a transaction's snapshot diffs")
    d.add_argument("tx")
    d.set_defaults(handler=_audit_diff)
    au.add_parser("verify", help="check the audit journal's hash chain").set_defaults(handler=_audit_verify)

    ad = sub.add_parser("adopt", help="record the container serving a slot as its incumbent")
    ad.add_argument("container_id")
    ad.add_argument("--slot", required=True)
    ad.add_argument("--context-tokens", type=int, required=True)
    ad.add_argument("--dry-run", action="store_true")
    ad.set_defaults(handler=_adopt)

    from anvil_ctl import cli_more

    cli_more.register(sub)
