"""The seed campaign replayed end to end: real Docker, real smg, the openai client, simulated GPUs.

The stub engines' simulated GPU figures follow the reports in shared/seeds: on two
97,887 MiB cards the 499,712-token C4 profile leaves 49 MiB free, the 393,216-token
C1 profile 2,101 MiB after the workload, the 245,760-token C1 profile 3,487 MiB,
against the standing 3,072 MiB reserve. The rest of the campaign rides along: the
matched A/B control of two 131K arms, the bounded final log audit, free VRAM after
real-client acceptance, the claim ledger and the one-page report.

The campaign runs twice, once on each state backend (issue 15): on the state directory's
SQLite file, and on a fresh database of the PostgreSQL server the test environment starts
(`tests.pgserver`; failed, not skipped, where the suite requires it). Every step is the same
on both, but two: the no-token check reads the SQLite file, or every row of every table of
the PostgreSQL database; `db copy` (SQLite history into PostgreSQL) runs from SQLite only.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.core.model import Readmission
from scripts.campaign import (
    INCUMBENT_MODEL,
    Campaign,
    publish_claims,
    reserve_waiver,
    start_campaign,
    start_incumbent_by_hand,
)
from scripts.campaign import runtime as make_runtime
from tests.conftest import BACKENDS
from tests.pgserver import PgServer, skip_or_fail, table_text

_RUNTIME: list[Any] = []


def runtime() -> Any:
    """One Docker runtime for the module (closed with the campaign)."""
    if not _RUNTIME:
        _RUNTIME.append(make_runtime())
    return _RUNTIME[0]


pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=BACKENDS)
def camp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    """The campaign on `backend`: SQLite in its state directory, or a fresh PostgreSQL database
    (empty: `init` migrates it), dropped at the end."""
    backend = str(request.param)
    server: PgServer | None = None
    database = ""
    if backend == "postgresql":
        server = request.getfixturevalue("pg_server")
        if server is None:
            skip_or_fail()
        assert server is not None
        database = server.database(migrated=False)
    c = start_campaign(tmp_path_factory.mktemp(f"campaign-{backend}"))
    c.__dict__["backend"] = backend
    if server is not None:
        c.env["ANVIL_STATE_DB"] = server.url_str(database)
    try:
        assert c.anvilctl("init").returncode == 0
        start_incumbent_by_hand(c)
        r = c.anvilctl("adopt", c.incumbent_id, "--slot", "primary", "--context-tokens", "524288")
        assert r.returncode == 0, r.stderr
        yield c
    finally:
        c.stop()
        rt = runtime()
        for info in rt.list(labels={"io.anvil.managed": "true"}):
            rt.remove(info.id, force=True)
        if c.incumbent_id:  # the next backend's campaign starts its incumbent under the same name
            with contextlib.suppress(Exception):
                rt.remove(c.incumbent_id, force=True)
        rt.close()
        _RUNTIME.clear()
        if server is not None:
            server.drop(database)


def j(r: Any) -> Any:
    assert r.returncode in (0, 3, 4, 5, 6), r.stderr
    return json.loads(r.stdout)


def decision_of(c: Campaign, qualify_tx: str) -> dict[str, Any]:
    rows = [d for d in j(c.anvilctl("--json", "audit", "decisions")) if d["tx_id"] == qualify_tx]
    assert rows, f"no decision recorded for {qualify_tx}"
    return rows[0]


def load_and_qualify(c: Campaign, recipe: str) -> tuple[str, str, dict[str, Any]]:
    r = c.anvilctl("--json", "load", recipe, "--slot", "primary")
    out = j(r)
    assert out["state"] == "committed", out
    container = out["results"]["start-candidate"]["container_id"]
    q = c.anvilctl("--json", "qualify", "--slot", "primary", "--profile", "demo")
    assert q.returncode == 0, q.stderr
    qtx = j(q)["tx_id"]
    return container, qtx, decision_of(c, qtx)


def unload(c: Campaign, container: str) -> None:
    r = c.anvilctl("--json", "unload", container, "--yes")
    assert r.returncode == 0, r.stderr


def state_of(c: Campaign) -> dict[str, str]:
    return {i.id: i.status for i in runtime().list()}


class TestSeedCampaign:
    """One campaign, in order; each test is one step of the seeds' story."""

    def test_01_the_incumbent_serves_llm_primary_through_the_router(self, camp: Campaign) -> None:
        check = j(camp.anvilctl("--json", "recheck", "--slot", "primary"))
        assert check["passed"], check["failed"]

    def test_01b_the_matched_ab_control_selects_adaptive_mtp_inside_its_declared_boundary(
        self, camp: Campaign
    ) -> None:
        arms = []
        for recipe, slot in (("stub-131k-nospec", "ab-nospec"), ("stub-131k-mtp", "ab-mtp")):
            out = j(camp.anvilctl("--json", "load", recipe, "--slot", slot))
            assert out["state"] == "committed", out["reason"]
            arms.append(out["results"]["start-candidate"]["container_id"])
        r = camp.anvilctl(
            "--json",
            "qualify",
            "--ab",
            "stub-131k-nospec",
            "stub-131k-mtp",
            "--slot",
            "ab-mtp",
            "--profile",
            "ab-stub",
        )
        assert r.returncode == 0, r.stderr
        out = j(r)
        verdict = out["comparison"]["verdict"]
        assert (verdict["outcome"], verdict["selected"]) == ("selected", "stub-131k-mtp"), verdict
        assert [c["label"] for c in out["comparison"]["cells"]] == ["4K/C1", "16K/C1"]
        assert all(c["delta_pct"]["decode_p50"] > 25 for c in out["comparison"]["cells"])  # 1,035 vs 741
        declared = json.loads((Path(out["tx_dir"]) / "00-declaration.json").read_text())
        assert (
            out["results"]["declare"]["digest"]
            == declared["digest"]
            == out["comparison"]["declaration_digest"]
        )
        assert j(camp.anvilctl("--json", "evidence", "verify", out["tx_dir"]))["ok"] is True
        for container in arms:
            unload(camp, container)

    def test_02_the_499k_c4_candidate_is_policy_infeasible(self, camp: Campaign) -> None:
        container, _, decision = load_and_qualify(camp, "stub-499k-c4")
        assert decision["outcome"] == "policy-infeasible"
        unload(camp, container)

    def test_03_the_393k_c1_candidate_passes_function_but_not_the_reserve(self, camp: Campaign) -> None:
        container, qtx, decision = load_and_qualify(camp, "stub-393k-c1")
        assert decision["outcome"] == "policy-infeasible"
        gates = j(camp.anvilctl("--json", "audit", "show", qtx))
        assert gates["kind"] == "qualify"
        rows = {g["gate"]: g for g in j(camp.anvilctl("--json", "audit", "evidence", qtx))["gates"]}
        assert (rows["log_audit"]["passed"], rows["log_audit"]["classification"]) == (True, "pass")
        audit_file = camp.work / "state" / "evidence" / qtx / Path(rows["log_audit"]["artifact"]).name
        window = json.loads(audit_file.read_text())["evidence"]["window"]
        assert window["max_lines"] == 20000 and window["lines_read"] >= 1 and not window["truncated"]
        camp.__dict__["q393"] = qtx
        unload(camp, container)

    def test_04_the_245k_c1_candidate_is_verified_and_not_promoted(self, camp: Campaign) -> None:
        container, _, decision = load_and_qualify(camp, "stub-245k-c1")
        assert decision["outcome"] == "verified"
        camp.__dict__["c245"] = container

    def test_05_a_restore_group_without_the_rollback_identity_is_refused(self, camp: Campaign) -> None:
        before = state_of(camp)
        r = camp.anvilctl("--json", "restore", "--slot", "primary", "--restore-group", "split-compute-a")
        assert r.returncode == 3
        assert "does not contain the declared rollback identity" in j(r)["reason"]
        assert state_of(camp) == before

    def test_06_a_restore_without_the_router_token_is_refused_before_mutation(self, camp: Campaign) -> None:
        unload(camp, camp.__dict__["c245"])
        no_token = camp.write_config(camp.work / "anvil-no-token.toml", with_credentials=False)
        env = camp.env | {"ANVIL_CONFIG": str(no_token)}
        before = state_of(camp)
        r = camp.anvilctl("--json", "restore", "--slot", "primary", env=env)
        assert r.returncode == 3
        out = j(r)
        assert out["refusal"]["guard"] == "RouterCredentialsAccepted"
        assert "ANVIL_ROUTER_ADMIN_TOKEN" in out["reason"] or "client" in out["reason"]
        assert state_of(camp) == before

    def test_07_a_world_readable_credential_file_is_refused(self, camp: Campaign) -> None:
        os.chmod(camp.cred, 0o644)
        try:
            r = camp.anvilctl("--json", "restore", "--slot", "primary")
            assert r.returncode == 3
            assert "0644" in j(r)["reason"]
        finally:
            os.chmod(camp.cred, 0o600)

    def test_08_restore_with_the_token_file_brings_back_the_same_container(self, camp: Campaign) -> None:
        out = j(camp.anvilctl("--json", "restore", "--slot", "primary"))
        if out["state"] != "committed":
            diffs = j(camp.anvilctl("--json", "audit", "diff", out["tx_id"]))
            pytest.fail(json.dumps({"reason": out["reason"], "diffs": diffs}, indent=1))
        assert runtime().inspect(camp.incumbent_id).running
        diffs = j(camp.anvilctl("--json", "audit", "diff", out["tx_id"]))
        (restored,) = [d for d in diffs if d["label"] == "recorded-restored"]
        # Only incidental fields may differ (residue of other programs, names, router labels).
        incidental = ("shm_residue", ".name", "observed_model", ".state", "ready")
        assert [c["path"] for c in restored["changes"] if not any(k in c["path"] for k in incidental)] == []
        check = j(camp.anvilctl("--json", "recheck", "--slot", "primary"))
        assert check["passed"], check["failed"]

    def test_09_a_reserve_waiver_reclassifies_the_393k_decision_and_keeps_raw_evidence(
        self, camp: Campaign
    ) -> None:
        qtx = camp.__dict__["q393"]
        before = j(camp.anvilctl("--json", "audit", "show", qtx))
        r = camp.anvilctl(
            "--json",
            *reserve_waiver(
                "operator", "model-only GPU pair; 2,101 MiB free after workload accepted", days=None
            ),
        )
        assert r.returncode == 0, r.stderr
        decisions = [d for d in j(camp.anvilctl("--json", "audit", "decisions")) if d["reclassifies"]]
        assert any(d["outcome"] == "verified" for d in decisions)
        assert j(camp.anvilctl("--json", "audit", "show", qtx)) == before

    def test_10_promote_the_393k_candidate_with_an_approver(self, camp: Campaign) -> None:
        out = j(camp.anvilctl("--json", "load", "stub-393k-c1", "--slot", "primary"))
        assert out["state"] == "committed"
        r = camp.anvilctl("--json", "promote", "--slot", "primary", "--approved-by", "operator")
        out = j(r)
        assert out["state"] == "committed", out["reason"]
        assert out["results"]["routed-smoke"]["status"] == 200
        assert out["results"]["acceptance"]["passed"] is True
        assert not runtime().inspect(camp.incumbent_id).running
        # Free VRAM after real clients, against the reserve the waiver sets (0), in the record.
        reading = out["results"]["vram-after-acceptance"]
        assert [(c["role"], c["free_mib"], c["threshold_mib"]) for c in reading["cards"]] == [
            ("compute-a", 2101, 0),
            ("compute-b", 2101, 0),
        ]
        assert reading["standing_mib"] == {"compute-a": 3072, "compute-b": 3072} and reading["waivers"]
        assert out["results"]["record-promotion"]["vram_after_acceptance"] == {
            "step": "vram-after-acceptance",
            "passed": True,
            "manifest_sha256": reading["manifest_sha256"],
        }
        shown = j(camp.anvilctl("--json", "audit", "show", out["tx_id"]))
        assert any(e["step"] == "vram-after-acceptance" and e["event"] == "result" for e in shown["steps"])

    def test_10b_claims_recount_from_the_exported_bundle_and_a_changed_number_exits_6(
        self, camp: Campaign
    ) -> None:
        bundle = camp.work / "bundle-393k"
        assert (
            camp.anvilctl("--json", "evidence", "export", camp.__dict__["q393"], str(bundle)).returncode == 0
        )
        claims = publish_claims(bundle, camp.work / "claims.toml")
        ok = camp.anvilctl("--json", "claims", "check", str(claims), "--evidence", str(bundle))
        assert ok.returncode == 0, ok.stdout
        assert [c["status"] for c in j(ok)["claims"]] == ["ok", "ok", "external-prior"]
        text = claims.read_text()
        claims.write_text(text.replace('published = "2,101"', 'published = "2,543"'))
        bad = camp.anvilctl("claims", "check", str(claims), "--evidence", str(bundle))
        assert bad.returncode == 6
        assert "DIFFERS          2,101 MiB/card free after qualification" in bad.stdout
        table = camp.anvilctl("claims", "render", str(claims))
        assert table.returncode == 0 and "| Public claim | Conditions | Evidence |" in table.stdout

    def test_10c_the_report_shows_the_promotions_reading_after_acceptance(self, camp: Campaign) -> None:
        page = camp.work / "report.html"
        r = camp.anvilctl("evidence", "report", camp.__dict__["q393"], "-o", str(page))
        assert r.returncode == 0, r.stderr
        html = page.read_text()
        assert "after acceptance" in html and "reserve in force 0 MiB" in html
        assert "RECLASSIFIED" in html.upper() and html.count("<svg") == 2

    def test_11_rollback_returns_the_exact_incumbent(self, camp: Campaign) -> None:
        out = j(camp.anvilctl("--json", "rollback", "--slot", "primary"))
        assert out["state"] == "committed", out["reason"]
        assert runtime().inspect(camp.incumbent_id).running
        check = j(camp.anvilctl("--json", "recheck", "--slot", "primary"))
        assert check["passed"], check["failed"]
        served = j(camp.anvilctl("--json", "status"))["slots"]["primary"]["serving"]["models"]
        assert served == [[INCUMBENT_MODEL, 524288]]

    def test_11b_recheck_names_each_drift_injected_one_at_a_time(self, camp: Campaign) -> None:
        from anvil_ctl.adapters.credentials import resolve_credentials
        from anvil_ctl.adapters.smg import SmgRouter
        from anvil_ctl.config.host import load_host_config
        from tests.integration.hosts import stub_container_spec

        def failed() -> list[str]:
            r = camp.anvilctl("--json", "recheck", "--slot", "primary")
            out = j(r)
            assert r.returncode == (0 if out["passed"] else 6)
            return list(out["failed"])

        rt = runtime()
        assert failed() == []
        # 1. the incumbent stopped by hand
        rt.stop(camp.incumbent_id, 10)
        assert "incumbent_container_running" in failed()
        rt.start(camp.incumbent_id)
        host = load_host_config(Path(camp.env["ANVIL_CONFIG"]))
        with SmgRouter(camp.router.url, resolve_credentials(host.router, {})) as router:
            router.readmit(
                Readmission("primary-local", "http://127.0.0.1:8001", ("llm.primary",), INCUMBENT_MODEL, 120)
            )
        assert failed() == []
        # 2. a candidate left running
        image = rt.inspect(camp.incumbent_id).image_id
        stray = stub_container_spec(
            image,
            name="stray-candidate",
            port=8011,
            served_model="stray",
            labels={"io.anvil.managed": "true", "io.anvil.role": "candidate"},
        )
        stray_id = rt.create(stray)
        rt.start(stray_id)
        try:
            assert failed() == ["no_candidate_running"]
        finally:
            rt.remove(stray_id, force=True)
        # 3. the route changed under us
        with SmgRouter(camp.router.url, resolve_credentials(host.router, {})) as router:
            router.deregister("primary-local", "http://127.0.0.1:8001")
            assert "router_readiness" in failed()
            router.readmit(
                Readmission("primary-local", "http://127.0.0.1:8001", ("llm.primary",), INCUMBENT_MODEL, 120)
            )
        # 4. a shared-memory residue file named like an engine's (NCCL) segment; a foreign
        # file beside it is not ours and never counts
        residue = Path("/dev/shm/nccl-anvil-test-residue")
        foreign = Path("/dev/shm/anvil-test-foreign-file")
        try:
            foreign.write_bytes(b"f" * 4096)
            assert failed() == []
            residue.write_bytes(b"x" * 4096)
            assert failed() == ["shm_residue_zero"]
        finally:
            residue.unlink(missing_ok=True)
            foreign.unlink(missing_ok=True)
        # 5. a wrong served model on the binding
        rt.stop(camp.incumbent_id, 10)
        wrong = stub_container_spec(image, name="wrong-model", port=8001, served_model="not-the-incumbent")
        wrong_id = rt.create(wrong)
        rt.start(wrong_id)
        try:
            assert {"served_model", "incumbent_container_running"} <= set(failed())
        finally:
            rt.remove(wrong_id, force=True)
            rt.start(camp.incumbent_id)
            with SmgRouter(camp.router.url, resolve_credentials(host.router, {})) as router:
                router.readmit(
                    Readmission(
                        "primary-local", "http://127.0.0.1:8001", ("llm.primary",), INCUMBENT_MODEL, 120
                    )
                )
        assert failed() == []

    def test_12_the_audit_trail_is_complete_and_verifies(self, camp: Campaign) -> None:
        assert j(camp.anvilctl("--json", "audit", "verify"))["ok"] is True
        kinds = [
            t["kind"] for t in reversed(j(camp.anvilctl("--json", "audit", "transactions", "--limit", "100")))
        ]
        assert kinds[:1] == ["adopt"]
        for kind in ("load", "qualify", "promote", "rollback"):
            assert kind in kinds
        states = {t["state"] for t in j(camp.anvilctl("--json", "audit", "transactions", "--limit", "100"))}
        assert "refused" in states

    def test_12b_db_copy_carries_the_campaign_into_postgresql_where_it_verifies(
        self, camp: Campaign, pg_database: Callable[..., str]
    ) -> None:
        """Issue 15 point 6: the campaign's SQLite history copied into an empty PostgreSQL
        database (migrated by the copy), verified there in full; a second copy is refused."""
        if camp.__dict__["backend"] != "sqlite":
            pytest.skip("db copy carries an SQLite history into PostgreSQL; this one is there already")
        url = pg_database(migrated=False)
        source = j(camp.anvilctl("--json", "audit", "transactions", "--limit", "1000"))
        out = j(camp.anvilctl("--json", "db", "copy", "--to", url))
        assert out["target_verified"]["ok"] is True and out["rows"]["transactions"] == len(source)
        on_target = {**camp.env, "ANVIL_STATE_DB": url}
        verify = camp.anvilctl("--json", "audit", "verify", "--full", "--all-hosts", env=on_target)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        copied = j(camp.anvilctl("--json", "audit", "transactions", "--limit", "1000", env=on_target))
        assert sorted(t["tx_id"] for t in copied) == sorted(t["tx_id"] for t in source)
        assert camp.anvilctl("db", "copy", "--to", url).returncode == 9

    def test_13_no_token_appears_in_the_database_logs_snapshots_or_evidence(self, camp: Campaign) -> None:
        tokens = [camp.admin_token.encode(), camp.client_token.encode()]
        files = [p for p in (camp.work / "state").rglob("*") if p.is_file()]
        leaks = [str(p) for p in files for t in tokens if t in p.read_bytes()]
        if camp.__dict__["backend"] == "sqlite":
            assert any(p.name == "anvil.db" for p in files)
        else:  # every row of every table, as text (a bytea column as hex)
            rows = table_text(camp.env["ANVIL_STATE_DB"])
            assert camp.incumbent_id in rows  # the history is there to be searched
            leaks += ["the state database" for t in tokens if t.decode() in rows or t.hex() in rows]
        logs = "".join(camp.log).encode()
        assert [t for t in tokens if t in logs] == []
        assert leaks == []

    def test_14_rollback_refuses_when_the_retained_container_was_removed(self, camp: Campaign) -> None:
        out = j(camp.anvilctl("--json", "load", "stub-245k-c1", "--slot", "primary"))
        assert out["state"] == "committed"
        rt = runtime()
        rt.remove(camp.incumbent_id, force=True)
        r = camp.anvilctl("--json", "restore", "--slot", "primary")
        assert r.returncode == 3 and "was removed" in j(r)["reason"]
