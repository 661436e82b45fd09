"""`recheck --slo` on real Docker with a real smg and the official client: a healthy stub holds
its thresholds (exit 0), a stub whose streams are cut from the start breaches them (exit 6,
the breach named), and a promoted serve that turns slow is rolled back by
`--rollback-on-breach`, the rollback attributed to the policy and its enabler; the last on
HAProxy too.

The thresholds come from a profile file with a `[watch]` table of absolute limits, sampled
twice 0.2 s apart (a breach: both samples fail one limit)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import audit, lifecycle
from anvil_ctl.core.states import TxState
from scripts.campaign import verified_decision
from scripts.routers import Proc, start_smg
from tests.integration.test_recheck_campaign import CANDIDATE, anvilctl, close_host, loaded_host
from tests.integration.test_router_smg import Keys

pytestmark = pytest.mark.integration

WATCH = """
name = "watch-it"
[[gates]]
type = "smoke"
[watch]
interval_s = 0.2
requests = 2
max_tokens = 8
consecutive = 2
[[watch.thresholds]]
metric = "ttft_p95_s"
max = 1.5
[[watch.thresholds]]
metric = "error_rate"
max = 0
[[watch.thresholds]]
metric = "finish_reason_missing"
max = 0
"""


@pytest.fixture
def host_with(tmp_path: Path, stub_container: Any, runtime: Any) -> Iterator[Callable[..., dict[str, Any]]]:
    """`make(incumbent_args, candidate_args)`: smg, an incumbent adopted and routed, a candidate
    loaded from a copy of stub-393k-c1 with `candidate_args`, and the profile file `watch.toml`."""
    made: list[tuple[dict[str, Any], Proc]] = []

    def make(
        *, load: bool, incumbent_args: tuple[str, ...] = (), candidate_args: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        smg = start_smg(workdir=tmp_path / "smg", admin_token=Keys.admin, client_token=Keys.client)
        host = loaded_host(
            tmp_path,
            stub_container,
            smg.url,
            load=load,
            incumbent_args=incumbent_args,
            candidate_args=candidate_args,
        )
        (tmp_path / "watch.toml").write_text(WATCH)
        made.append((host, smg))
        return {**host, "profile": str(tmp_path / "watch.toml"), "router_url": smg.url}

    yield make
    for host, smg in made:
        close_host(host, runtime)
        smg.stop()


def slo(host: dict[str, Any], *extra: str) -> tuple[int, dict[str, Any]]:
    r = anvilctl(
        host["env"], "--json", "recheck", "--slot", "primary", "--slo", "--profile", host["profile"], *extra
    )
    out = json.loads(r.stdout)
    return r.returncode, next(a for a in out["assertions"] if a["name"] == "slo") | {"failed": out["failed"]}


class TestRecheckSlo:
    def test_a_healthy_serve_holds_its_thresholds(self, host_with: Callable[..., dict[str, Any]]) -> None:
        host = host_with(load=False)
        code, found = slo(host)
        assert (code, found["passed"], found["failed"]) == (0, True, []), found
        observed = found["observed"]
        assert [len(s["requests"]) for s in observed["samples"]] == [2, 2]
        assert observed["limits"][0] == {
            "metric": "ttft_p95_s",
            "op": "max",
            "limit": 1.5,
            "source": "max 1.5",
        }
        assert all(r["finish_reason"] for s in observed["samples"] for r in s["requests"])

    def test_cut_streams_are_a_breach_named_with_their_samples(
        self, host_with: Callable[..., dict[str, Any]]
    ) -> None:
        host = host_with(load=False, incumbent_args=("--late-fault", "truncate-stream@0"))
        code, found = slo(host)
        assert (code, found["passed"], found["failed"]) == (6, False, ["slo"]), found
        (breach,) = found["observed"]["breaches"]
        assert breach["metric"] == "finish_reason_missing" and breach["observed"] == [1.0, 1.0]
        assert found["observed"]["rollback"] is None  # not asked for: nothing changed

    def test_rollback_on_breach_brings_back_the_recorded_incumbent_attributed_to_the_policy(
        self, host_with: Callable[..., dict[str, Any]]
    ) -> None:
        host = host_with(load=True, candidate_args=("--late-fault", "slow-first-token:2.5@0"))
        verified_decision(host["app"].store, "primary", "slo-{digest}")
        promoted = lifecycle.promote(host["app"], slot="primary", approved_by="slo-test")
        assert promoted.state == TxState.COMMITTED, promoted.reason
        enable = ("--rollback-on-breach", "--by", "alice", "--until", "2099-01-01", "--reason", "bake")
        code, found = slo(host, *enable)
        assert (code, found["passed"]) == (6, False), found
        (breach,) = found["observed"]["breaches"]
        assert breach["metric"] == "ttft_p95_s" and min(breach["observed"]) >= 2.5
        rolled = found["observed"]["rollback"]
        assert rolled["ran"] is True and rolled["state"] == "committed", rolled
        decided = audit.show(host["app"], rolled["tx_id"])["args"]["decided_by"]
        assert (decided["policy"], decided["enabled_by"], decided["reason"]) == (
            "rollback-on-breach",
            "alice",
            "bake",
        )
        assert (
            decided["until"].startswith("2099-01-01T00:00:00")
            and decided["breaches"][0]["metric"] == "ttft_p95_s"
        )
        incumbent = host["app"].store.current_identity("primary", "incumbent")
        assert incumbent is not None and incumbent.container_id == host["incumbent"].id
        code, after = slo(host)
        assert (code, after["passed"]) == (0, True), after  # the incumbent answers well again
        assert incumbent.served_model != CANDIDATE


class TestOnHaproxy:
    def test_a_slow_promoted_serve_breaches_and_is_rolled_back_through_haproxy(self, tmp_path: Path) -> None:
        """The same `recheck --slo` through HAProxy: a promoted candidate slow from its first
        token breaches ttft_p95_s (exit 6), `--rollback-on-breach` brings the recorded
        incumbent back, attributed to the policy, and the slot holds its thresholds again."""
        from tests.integration.conftest import campaign_host
        from tests.integration.test_load_docker import variant

        with campaign_host(tmp_path / "host", "haproxy") as host:
            variant(tmp_path, "slow", ["--late-fault", "slow-first-token:2.5@0"])
            loaded = host.run("load", str(tmp_path / "slow.toml"), "--slot", "primary")
            assert loaded["state"] == "committed", loaded.get("reason")
            verified_decision(host.app().store, "primary", "slo-{digest}")
            promoted = host.run("promote", "--slot", "primary", "--approved-by", "slo-test")
            assert promoted["state"] == "committed", promoted.get("reason")
            (tmp_path / "watch.toml").write_text(WATCH)
            slo = ("recheck", "--slot", "primary", "--slo", "--profile", str(tmp_path / "watch.toml"))
            enable = ("--rollback-on-breach", "--by", "alice", "--until", "2099-01-01", "--reason", "bake")
            out = host.run(*slo, *enable)
            assert (out["_exit"], out["failed"]) == (6, ["slo"]), out
            found = next(a["observed"] for a in out["assertions"] if a["name"] == "slo")
            (breach,) = found["breaches"]
            assert breach["metric"] == "ttft_p95_s" and min(breach["observed"]) >= 2.5
            rolled = found["rollback"]
            assert rolled["ran"] is True and rolled["state"] == "committed", rolled
            decided = audit.show(host.app(), rolled["tx_id"])["args"]["decided_by"]
            assert (decided["policy"], decided["enabled_by"]) == ("rollback-on-breach", "alice")
            assert host.phase_of(host.observe()) == "A"  # the incumbent serves and is routed
            again = host.run(*slo)
            assert (again["_exit"], again["failed"]) == (0, []), again
