"""`anvilctl fleet status`: every host sharing the state database (a PostgreSQL fleet)."""

from __future__ import annotations

import click

from anvil_ctl.cli.session import Reply, Session, example, group, pass_session


@click.command("status", epilog=example("anvilctl fleet status --json"))
@pass_session
def fleet_status(session: Session) -> Reply:
    """Every host sharing the state database: slots, incumbents, last recheck, open transactions."""
    from anvil_ctl.cli.views import Record
    from anvil_ctl.commands import audit

    return Reply(Record({"hosts": audit.fleet_status(session.app())}))


fleet = group("fleet", "The hosts that share this state database.", "anvilctl fleet status", fleet_status)
