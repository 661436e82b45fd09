"""`anvilctl fleet ...`: the hosts that share this state database (read-only)."""

from __future__ import annotations

from anvil_ctl.bootstrap import App
from anvil_ctl.persistence import fleet
from anvil_ctl.persistence.fleet import HostStatus


def status(app: App) -> list[HostStatus]:
    """Every host registered in the state database: its slots' incumbents, its last
    recheck, its unresolved transactions and held locks (`persistence.fleet.status`)."""
    return fleet.status(app.store)
