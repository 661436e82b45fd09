"""Subcommands: gpus (probe readings), gpus detect, waive, waivers list|revoke.

`anvilctl init --detect-gpus` reuses `add_detect_arguments` and `detect_from_args`.
"""

from __future__ import annotations

import argparse
from typing import Any

from anvil_ctl.commands import gpu as gpu_cmds
from anvil_ctl.gpu.waivers import POLICIES


def add_detect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="UUID=ROLE",
        help="name the GPU with this UUID ROLE instead of compute-a, compute-b, ... (repeatable)",
    )


def detect_from_args(a: argparse.Namespace, ctx: Any, *, write: bool) -> dict[str, Any]:
    return gpu_cmds.detect(ctx, overrides=gpu_cmds.parse_overrides(a.override), write=write)


def _gpus(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = gpu_cmds.readings(ctx)
    if a.json:
        return result, 0
    keep = ("index", "role", "uuid", "total_mib", "used_mib", "free_mib")
    rows = []
    for g in result["gpus"]:
        owner = g["owner"]
        who = f"{owner['container_id'][:12]} ({owner['mode']})" if owner else ""
        rows.append({k: g[k] for k in keep} | {"owner": who, "processes": len(g["processes"])})
    return rows, 0


def _gpus_detect(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = detect_from_args(a, ctx, write=a.write)
    if a.json:
        return result, 0
    if result["written"]:
        state = f"written to {result['config']}"
    elif not result["changed"]:
        state = f"{result['config']} already has these roles"
    else:
        state = f"not written to {result['config']} (pass --write)"
    # TOML is the useful human form; the CLI layer prints it itself.
    print(result["toml"] + f"# {state}")
    return None, 0


def _waive(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    result = gpu_cmds.waive(
        ctx,
        policy=a.policy,
        scope=a.scope,
        value=a.value,
        approved_by=a.approved_by,
        reason=a.reason,
        expires=a.expires,
    )
    return result, 0


def waivers_list(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    """Handler of `waivers list` (and of `audit waivers`)."""
    rows = gpu_cmds.list_waivers(ctx)
    if a.json:
        return rows, 0
    keep = (
        "id",
        "state",
        "policy",
        "value",
        "roles",
        "recipe_digest",
        "approved_by",
        "created_at",
        "expires_at",
        "revoked_at",
        "reason",
    )
    return [{k: r[k] for k in keep} for r in rows], 0


def _waivers_revoke(a: argparse.Namespace, ctx: Any) -> tuple[Any, int]:
    return gpu_cmds.revoke(ctx, a.waiver_id, by=a.by, reason=a.reason), 0


def register(sub: Any) -> None:
    g = sub.add_parser("gpus", help="GPU readings by UUID with role and owner (--json: all)")
    g.set_defaults(handler=_gpus)
    gs = g.add_subparsers(dest="gpus_cmd", required=False)
    d = gs.add_parser("detect", help="name the GPUs as host-config roles (largest first)")
    add_detect_arguments(d)
    d.add_argument(
        "--write",
        action="store_true",
        help="write the [gpu_roles.*] tables into the host config (the rest of the file is kept)",
    )
    d.set_defaults(handler=_gpus_detect)

    w = sub.add_parser("waive", help="record an attributed, scoped, expiring policy waiver")
    w.add_argument("--policy", required=True, help=f"one of {', '.join(POLICIES)}")
    w.add_argument("--scope", required=True, help="GPU roles (compute-a,compute-b) or a recipe digest")
    w.add_argument("--value", type=int, required=True, help="the policy value in force (MiB)")
    w.add_argument("--approved-by", required=True, help="who approves the exception")
    w.add_argument("--reason", required=True)
    w.add_argument("--expires", help="ISO date (ends 00:00 UTC that day) or date-time")
    w.set_defaults(handler=_waive)

    ws = sub.add_parser("waivers", help="list or revoke waivers").add_subparsers(
        dest="waivers_cmd", required=True
    )
    ws.add_parser("list", help="every waiver with its state now").set_defaults(handler=waivers_list)
    r = ws.add_parser("revoke", help="revoke a waiver (a new record; the waiver stays)")
    r.add_argument("waiver_id")
    r.add_argument("--by", required=True, help="who revokes it")
    r.add_argument("--reason", required=True)
    r.set_defaults(handler=_waivers_revoke)
