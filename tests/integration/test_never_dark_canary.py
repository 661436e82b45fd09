"""Never dark for a canary on real Docker and a real HAProxy: `promote --canary` killed at its
journal boundaries, then `recover`, and the host is the incumbent or the candidate serving alone
(the rest of the never-dark suite: test_never_dark.py, on smg)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from anvil_ctl.commands import audit
from scripts.chaos import CANARY, CanaryHost, Case, recent_transactions
from tests.integration.test_never_dark import _all_ok

pytestmark = pytest.mark.integration


@pytest.fixture(scope="class")
def canary_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanaryHost]:
    """HAProxy, the incumbent stub in slot primary and a candidate stub in primary-b of the same
    tier: torn down after its class."""
    h = CanaryHost(tmp_path_factory.mktemp("never-dark-canary"))
    try:
        yield h
    finally:
        h.stop()


class TestACanaryKilledAtItsBoundaries:
    """`promote --canary 10,50,100` killed at four of its 26 boundaries (`make chaos` with
    `--commands promote-canary` kills at all): as it begins, as a share step's watch ends, as
    the last share ends with the incumbent at weight 0, and in its closing steps. Before the
    pivot `recover` goes back to the incumbent alone in the tier; after it, forward."""

    @pytest.mark.parametrize(
        ("boundary", "converged"),
        [
            # The candidate not yet a server of the tier: the undo weighs the incumbent alone.
            ("canary:declare:do:result", "before"),
            ("canary:share-10:do:result", "before"),
            # The incumbent at weight 0: the readmission gives it its full weight back.
            ("canary:share-100:do:result", "before"),
            ("canary:record-promotion:do:intent", "after"),
        ],
    )
    def test_recover_brings_it_to_the_incumbent_or_the_candidate_serving_alone(
        self, canary_host: CanaryHost, boundary: str, converged: str
    ) -> None:
        known = {t["tx_id"] for t in recent_transactions(canary_host.app())}
        verdict = canary_host.case(Case(CANARY, "crash", boundary))
        _all_ok([verdict])
        assert verdict.converged == converged, verdict
        # This case's canary was killed there and `recover` finished it (not a canary that
        # never met the boundary, nor one refused before it began).
        app = canary_host.app()
        [tx] = [t for t in recent_transactions(app) if t["kind"] == "canary" and t["tx_id"] not in known]
        states = [s["state"] for s in audit.show(app, tx["tx_id"])["states"]]
        assert "interrupted" in states, states
