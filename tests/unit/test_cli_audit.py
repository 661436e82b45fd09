"""anvil_ctl.cli.audit: every `audit` listing the README documents, in human form and as JSON."""

from __future__ import annotations

import pytest

from anvil_ctl.commands import transactions
from anvil_ctl.core.states import ExitCode, TxState
from anvil_ctl.persistence import qualification
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

RAW = "dec-" + "1" * 60
RECLASSIFIED = "dec-" + "2" * 60
WAIVE = [
    "waive",
    "--policy",
    "vram-reserve",
    "--scope",
    "compute-a,compute-b",
    "--value",
    "0",
    "--approved-by",
    "operator",
    "--reason",
    "model-only pair",
    "--no-expiry",
]


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(fake_host, monkeypatch, capsys)


@pytest.fixture
def decided(fake_host: FakeHost) -> FakeHost:
    """A raw decision and its reclassification under a waiver."""
    store = fake_host.app().store
    common = {"tx_id": None, "slot": "primary", "identity_digest": "i" * 64, "container_id": "c" * 64}
    qualification.record_decision(
        store, decision_id=RAW, outcome="policy-infeasible", profile="demo", **common
    )
    qualification.record_decision(
        store,
        decision_id=RECLASSIFIED,
        outcome="verified",
        profile="demo",
        reclassifies=RAW,
        waiver_ids=["wvr-1", "wvr-2"],
        **common,
    )
    return fake_host


class TestAuditIncumbents:
    def test_lists_the_adopted_incumbent(self, anvilctl: Run, fake_host: FakeHost) -> None:
        r = anvilctl("audit", "incumbents", "--json")
        assert r.code == ExitCode.OK, r.err
        assert [(i["slot"], i["role"], i["container_id"]) for i in r.json()] == [
            ("primary", "incumbent", fake_host.incumbent_id)
        ]
        human = anvilctl("audit", "incumbents")
        assert human.code == ExitCode.OK and "incumbent" in human.out and "primary" in human.out

    def test_role_lists_the_loaded_candidate_instead(self, anvilctl: Run, fake_host: FakeHost) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        r = anvilctl("audit", "incumbents", "--role", "candidate", "--json")
        assert [(i["role"], i["served_model"]) for i in r.json()] == [("candidate", "cand-393k")]

    def test_an_unknown_slot_lists_nothing(self, anvilctl: Run) -> None:
        r = anvilctl("audit", "incumbents", "--slot", "secondary")
        assert (r.code, r.out) == (ExitCode.OK, "(none)\n")


class TestAuditWaivers:
    def test_lists_what_waivers_list_lists(self, anvilctl: Run) -> None:
        assert anvilctl(*WAIVE).code == ExitCode.OK
        audit = anvilctl("audit", "waivers", "--json")
        listed = anvilctl("waivers", "list", "--json")
        assert audit.code == ExitCode.OK
        assert audit.json() == listed.json()
        assert [(w["policy"], w["state"], w["value"]) for w in audit.json()] == [
            ("vram-reserve", "active", 0)
        ]
        human = anvilctl("audit", "waivers")
        assert "vram-reserve" in human.out and "active" in human.out


class TestAuditRechecks:
    def test_lists_each_recorded_recheck_newest_first(self, anvilctl: Run) -> None:
        assert anvilctl("recheck", "--slot", "primary").code == ExitCode.OK
        assert anvilctl("recheck").code == ExitCode.OK
        r = anvilctl("audit", "rechecks", "--json")
        assert r.code == ExitCode.OK
        assert [(c["slot"], c["passed"]) for c in r.json()] == [("primary", True), ("primary", True)]
        assert r.json()[0]["id"] > r.json()[1]["id"]
        assert len(anvilctl("audit", "rechecks", "--limit", "1", "--json").json()) == 1


class TestAuditDecisions:
    def test_json_keeps_every_field(self, anvilctl: Run, decided: FakeHost) -> None:
        r = anvilctl("audit", "decisions", "--json")
        assert r.code == ExitCode.OK
        assert [(d["id"], d["reclassifies"], d["waiver_ids"]) for d in r.json()] == [
            (RAW, None, []),
            (RECLASSIFIED, RAW, ["wvr-1", "wvr-2"]),
        ]
        assert r.json()[0]["container_id"] == "c" * 64

    def test_the_human_table_shortens_ids_and_joins_waivers(self, anvilctl: Run, decided: FakeHost) -> None:
        r = anvilctl("audit", "decisions", "--slot", "primary")
        assert r.code == ExitCode.OK
        assert RAW[:16] in r.out and RAW not in r.out
        assert "wvr-1,wvr-2" in r.out and "policy-infeasible" in r.out and "verified" in r.out


class TestAuditTransactions:
    def test_state_and_kind_filter_together(self, anvilctl: Run, fake_host: FakeHost) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        r = anvilctl("audit", "transactions", "--state", "committed", "--kind", "load")
        assert r.code == ExitCode.OK, r.err
        assert out.tx_id is not None and out.tx_id[:8] in r.out
        rows = anvilctl("audit", "transactions", "--state", "committed", "--kind", "load", "--json").json()
        assert [(t["tx_id"], t["kind"], t["state"]) for t in rows] == [(out.tx_id, "load", "committed")]

    def test_show_and_diff_name_the_transaction(self, anvilctl: Run, fake_host: FakeHost) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.tx_id is not None
        shown = anvilctl("audit", "show", out.tx_id[:8], "--json")
        assert shown.json()["tx_id"] == out.tx_id
        diffs = anvilctl("audit", "diff", out.tx_id[:8])
        assert diffs.code == ExitCode.OK and "change" in diffs.out


class TestAuditVerify:
    def test_an_intact_chain_exits_0(self, anvilctl: Run) -> None:
        r = anvilctl("audit", "verify")
        assert r.code == ExitCode.OK
        assert "hash chain intact" in r.out
        assert anvilctl("audit", "verify", "--json").json()["ok"] is True
