"""Administration: init, db upgrade, status (and --watch), fleet status, recover, resolve, lock
status|break."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from anvil_ctl.cli.complete import complete_transactions
from anvil_ctl.cli.options import override_option
from anvil_ctl.cli.params import NOTE, PERSON, REASON, REF, TIMEOUT, text
from anvil_ctl.cli.session import Lazy, Reply, Session, command, group
from anvil_ctl.core.states import ExitCode

if TYPE_CHECKING:
    from anvil_ctl.cli import views
    from anvil_ctl.commands import admin, audit, gpus_and_waivers, transactions
else:
    views = Lazy("anvil_ctl.cli.views")
    admin = Lazy("anvil_ctl.commands.admin")
    audit = Lazy("anvil_ctl.commands.audit")
    gpus_and_waivers = Lazy("anvil_ctl.commands.gpus_and_waivers")
    transactions = Lazy("anvil_ctl.commands.transactions")


GRANTS_HELP = "With --print-grants: a name the SQL uses."


@command("init", "anvilctl init --detect-gpus")
@click.option(
    "--detect-gpus", is_flag=True, help="Also probe the GPUs and write [gpu_roles.*] into the host config."
)
@override_option
@click.option(
    "--print-grants",
    is_flag=True,
    help="Only print the SQL for PostgreSQL's migration role (owns the schema) and application "
    "role (INSERT and SELECT history only); touches nothing.",
)
@click.option("--database", default="anvil", show_default=True, type=REF, metavar="NAME", help=GRANTS_HELP)
@click.option(
    "--owner-role", default="anvil_owner", show_default=True, type=REF, metavar="NAME", help=GRANTS_HELP
)
@click.option(
    "--app-role", default="anvil_app", show_default=True, type=REF, metavar="NAME", help=GRANTS_HELP
)
def init(
    session: Session,
    *,
    detect_gpus: bool,
    override: tuple[str, ...],
    print_grants: bool,
    database: str,
    owner_role: str,
    app_role: str,
) -> Reply:
    """Create the state database, or upgrade it to the current schema.

    Prints which state database and host config it used and where each came from (flag,
    ANVIL_*, or default). With --print-grants it only prints SQL (docs/POSTGRES.md)."""
    if print_grants:
        return Reply(views.Text(admin.print_grants(database=database, owner=owner_role, app=app_role)))
    with session.working("init: creating or upgrading the state database") as app:
        result = admin.init(app)
    if detect_gpus:
        with session.working("init: probing the GPUs"):
            result["gpu_roles"] = gpus_and_waivers.detect(
                app, overrides=gpus_and_waivers.parse_overrides(override), write=True
            )
    return Reply(views.InitView(result))


@command("upgrade", "anvilctl db upgrade")
def db_upgrade(session: Session) -> Reply:
    """Run the state database's migrations up to the current schema."""
    with session.working("db upgrade: running the state database's migrations") as app:
        return Reply(views.InitView(admin.init(app)))


@command("copy", "anvilctl db copy --to 'postgresql+psycopg://anvil_owner@db/anvil'")
@click.option(
    "--to",
    "to",
    required=True,
    type=text(4096),
    metavar="URL",
    help="The target state database (migrated to the current schema first); its password is never printed.",
)
def db_copy(session: Session, to: str) -> Reply:
    """Copy this host's whole history into another state database (a fleet's PostgreSQL).

    Verifies the source in full, copies in one transaction re-chaining its audit entries on the
    target, verifies the target and prints the rows per table. A target that already holds this
    host is refused (exit 9, nothing written)."""
    with session.working("db copy: verifying, copying and verifying the copy") as app:
        return Reply(admin.db_copy(app, to=to))


db = group("db", "State database maintenance.", "anvilctl db upgrade", db_upgrade, db_copy)


@command("status", "anvilctl status --watch --interval 5s")
@click.option(
    "-w", "--watch", is_flag=True, help="Observe again every --interval until Ctrl-C (like kubectl -w)."
)
@click.option(
    "--interval",
    type=TIMEOUT,
    default="2s",
    show_default=True,
    metavar="DURATION",
    help="With --watch: time between observations.",
)
@click.option(
    "--count",
    type=click.IntRange(1, 1_000_000),
    metavar="N",
    help="With --watch: stop after N observations (default: until Ctrl-C).",
)
def status(session: Session, watch: bool, interval: float, count: int | None) -> Reply:
    """Slots, incumbents, candidates, health and the router's view.

    Ends with the state database and host config it read. --watch observes again every
    --interval (a terminal redrawn, a pipe appended, --json one document per line)."""
    if count is not None and not watch:
        raise click.UsageError("--count goes with --watch")
    if not watch:
        with session.working("status: observing the containers, the engines and the router") as app:
            return Reply(views.StatusView(admin.status(app)))
    _watch_status(session, interval_s=interval, count=count)
    return Reply(None)


@command("recover", "anvilctl recover")
def recover(session: Session) -> Reply:
    """Compensate transactions whose owner died: backwards before the pivot, forwards after it.

    A `load --promote` killed before its promotion committed is finished: the promotion runs
    (every check of `promote`); refused or failed, the load's incumbent is brought back.
    Exit 5 when a transaction still needs an operator afterwards."""
    with session.working("recover: looking for transactions whose owner died") as app:
        report = transactions.recover_all(app)
    return Reply(report, ExitCode(report.exit_code))


@command("resolve", 'anvilctl resolve 8259c0de --by alice --note "restarted the incumbent by hand"')
@click.argument("tx", type=REF, shell_complete=complete_transactions)
@click.option("--by", required=True, type=PERSON, help="Who resolved it.")
@click.option("--note", required=True, type=NOTE, help="What they did.")
def resolve(session: Session, tx: str, by: str, note: str) -> Reply:
    """Record that a person resolved a compensation_failed or needs_operator transaction TX."""
    return Reply(transactions.resolve(session.app(), tx, by=by, note=note))


@command("status", "anvilctl lock status")
def lock_status(session: Session) -> Reply:
    """Who holds the host mutator lock."""
    return Reply(views.Table(transactions.lock_status(session.app())))


@command("break", 'anvilctl lock break 3 --by alice --reason "owner pid 4711 is gone"')
@click.argument("lock_id", type=REF)
@click.option("--by", required=True, type=PERSON, help="Who breaks the lock.")
@click.option("--reason", required=True, type=REASON, help="Why the owner is known to be dead.")
def lock_break(session: Session, lock_id: str, by: str, reason: str) -> Reply:
    """Release a dead owner's lock row LOCK_ID (journaled); a live owner is refused."""
    return Reply(transactions.lock_break(session.app(), lock_id, by=by, reason=reason))


lock = group("lock", "The host mutator lock.", "anvilctl lock status", lock_status, lock_break)


def _watch_status(session: Session, *, interval_s: float, count: int | None) -> None:
    """`status --watch`: observe again until Ctrl-C (or --count), as `kubectl get -w` does."""
    import json
    import sys
    import time
    from datetime import UTC, datetime

    from anvil_ctl.cli import render
    from anvil_ctl.cli.output import s
    from anvil_ctl.core.errors import Unavailable

    app = session.app()
    as_json = session.options.as_json
    terminal = sys.stdout.isatty() and not as_json
    seen = 0
    try:
        while count is None or seen < count:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            try:
                view: views.StatusView | None = views.StatusView(admin.status(app))
                problem = ""
            except Unavailable as exc:
                view, problem = None, str(exc)
            if as_json:
                data = view.payload() if view else {"observed_at": stamp, "unavailable": problem}
                print(json.dumps(data, sort_keys=True, default=str), flush=True)
            else:
                if terminal:
                    print("\x1b[H\x1b[2J", end="")  # home, clear: the terminal redrawn
                    print(f"every {interval_s:g} s, Ctrl-C to stop; {stamp}\n")
                else:
                    print(f"--- {stamp}")
                if view is not None:
                    render.show(view, False, wide=session.options.wide)
                else:
                    print(f"UNAVAILABLE: {s(problem)}")
                sys.stdout.flush()
            seen += 1
            if count is None or seen < count:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        if not as_json:
            print()


@command("status", "anvilctl fleet status --json")
def fleet_status(session: Session) -> Reply:
    """Every host sharing the state database: slots, incumbents, last recheck, open transactions."""
    return Reply({"hosts": audit.fleet_status(session.app())})


fleet = group("fleet", "The hosts that share this state database.", "anvilctl fleet status", fleet_status)
