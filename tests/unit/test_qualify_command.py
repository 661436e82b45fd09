"""The qualify command on the shipped fakes: refusals, reclassification under waivers, export."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import evidence as evidence_cmd
from anvil_ctl.commands import qualify as qualify_cmd
from anvil_ctl.commands import transactions
from anvil_ctl.core.states import TxState
from anvil_ctl.core.waiver import Waiver
from anvil_ctl.engine.reclassify import reclassify_decisions
from anvil_ctl.evidence.bundle import EvidenceWriter, verify_bundle
from anvil_ctl.persistence import qualification, waiver_rows
from anvil_ctl.qualify.profiles import PROFILES_DIR
from tests.unit.fakehost import FakeHost

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
T0 = datetime(2026, 9, 2, 12, 0, tzinfo=UTC)


def waiver(**kw: Any) -> Waiver:
    fields: dict[str, Any] = {
        "id": "w-1",
        "policy": "vram-reserve",
        "value": 0,
        "approved_by": "operator",
        "reason": "model-only pair",
        "created_at": T0,
        "roles": frozenset({"compute-a", "compute-b"}),
        "expires_at": T0 + timedelta(days=1),
    }
    return Waiver(**(fields | kw))


def raw_decision(host: FakeHost, *, free_mib: int = 2101, tx: str = "tx-raw") -> dict[str, Any]:
    """A stored raw policy-infeasible decision with its reserve artifact, as qualify leaves it."""
    app = host.app()
    app.store.begin(kind="qualify", slot="primary", args={}, owner=app.owner, tx_id=tx)
    writer = EvidenceWriter(app.settings.evidence_dir, tx)
    cards = [{"uuid": u, "free_mib": free_mib, "reserve_mib": 3072} for u in (GPU_A, GPU_B)]
    art = writer.write_json(
        "01-vram_reserve.json",
        {"name": "vram_reserve", "passed": False, "kind": "policy", "evidence": {"cards": cards}},
    )
    smoke = writer.write_json("00-smoke.json", {"name": "smoke", "passed": True})
    writer.write_manifest()
    qualification.record_evidence(
        app.store,
        tx,
        [
            {
                "name": "smoke",
                "kind": "functional",
                "passed": True,
                "classification": "pass",
                "artifact": str(writer.tx_dir / smoke.path),
                "sha256": smoke.sha256,
                "size": smoke.size,
            },
            {
                "name": "vram_reserve",
                "kind": "policy",
                "passed": False,
                "classification": "below_reserve",
                "artifact": str(writer.tx_dir / art.path),
                "sha256": art.sha256,
                "size": art.size,
            },
        ],
    )
    qualification.record_decision(
        app.store,
        decision_id="dec-raw",
        tx_id=tx,
        slot="primary",
        identity_digest="i" * 64,
        container_id="c" * 64,
        outcome="policy-infeasible",
        profile="seed-qualification",
        body={
            "policy": "standing",
            "recipe_digest": "d" * 64,
            "reserve_roles": {GPU_A.lower(): "compute-a", GPU_B.lower(): "compute-b"},
        },
    )
    return next(d for d in qualification.decisions(app.store) if d["id"] == "dec-raw")


def outcomes(app: App) -> list[tuple[str, str, str | None, list[str]]]:
    return [
        (d["id"], d["outcome"], d["reclassifies"], d["waiver_ids"])
        for d in qualification.decisions(app.store)
    ]


class TestQualifyRefusals:
    def test_a_slot_without_a_candidate_is_refused_and_journaled(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        out = qualify_cmd.qualify_slot(app, slot="primary", profile="smoke")
        assert (out.outcome.state, out.exit_code) == (TxState.REFUSED, 3)
        assert "no loaded candidate" in out.outcome.reason
        assert app.store.state(out.outcome.tx_id or "") == TxState.REFUSED
        assert qualification.decisions(app.store) == [] and out.result is None

    def test_a_candidate_whose_binding_serves_another_model_is_refused(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        out = transactions.load(app, slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        cand = app.store.current_identity("primary", "candidate")
        assert cand is not None
        with fake_host.world.edit() as w:
            w["containers"][cand.container_id]["served_model"] = "someone-else"
        q = qualify_cmd.qualify_slot(app, slot="primary", profile="smoke")
        assert q.exit_code == 3 and "serves ['someone-else']" in q.outcome.reason
        assert not (app.settings.evidence_dir / (q.outcome.tx_id or "-")).exists()


class TestReclassifyDecisions:
    def test_an_active_pair_waiver_adds_a_verified_decision_pointing_at_the_raw_one(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        raw = raw_decision(fake_host)
        waiver_rows.add_waiver(app.store, waiver())
        report = reclassify_decisions(app.world(), now=T0 + timedelta(hours=1))
        assert [(d["outcome"], d["reclassifies"], d["waiver_ids"]) for d in report.recorded] == [
            ("verified", "dec-raw", ["w-1"])
        ]
        assert next(d for d in qualification.decisions(app.store) if d["id"] == "dec-raw") == raw

    def test_reclassifying_again_under_the_same_waivers_records_nothing(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        raw_decision(fake_host)
        waiver_rows.add_waiver(app.store, waiver())
        reclassify_decisions(app.world(), now=T0 + timedelta(hours=1))
        before = outcomes(app)
        assert reclassify_decisions(app.world(), now=T0 + timedelta(hours=2)).recorded == []
        assert outcomes(app) == before

    def test_a_revoked_waiver_records_the_standing_outcome_again(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        raw_decision(fake_host)
        waiver_rows.add_waiver(app.store, waiver())
        reclassify_decisions(app.world(), now=T0 + timedelta(hours=1))
        waiver_rows.revoke_waiver(app.store, "w-1", by="operator", reason="pair reused")
        report = reclassify_decisions(app.world())
        assert [(d["outcome"], d["reclassifies"], d["waiver_ids"]) for d in report.recorded] == [
            ("policy-infeasible", "dec-raw", [])
        ]
        assert [o[1] for o in outcomes(app)] == [
            "policy-infeasible",
            "verified",
            "policy-infeasible",
        ]

    def test_a_waiver_too_small_for_the_shortfall_changes_nothing(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        raw_decision(fake_host)
        waiver_rows.add_waiver(app.store, waiver(value=2500))  # 2101 free is still short
        assert reclassify_decisions(app.world(), now=T0 + timedelta(hours=1)).recorded == []
        assert [o[0] for o in outcomes(app)] == ["dec-raw"]

    def test_a_tampered_reserve_artifact_is_skipped_not_trusted(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        raw_decision(fake_host)
        path = app.settings.evidence_dir / "tx-raw" / "01-vram_reserve.json"
        path.write_text(path.read_text().replace("2101", "9101"))
        waiver_rows.add_waiver(app.store, waiver())
        report = reclassify_decisions(app.world(), now=T0 + timedelta(hours=1))
        assert report.recorded == []
        assert report.skipped[0]["decision_id"] == "dec-raw"
        assert "SHA-256" in report.skipped[0]["reason"]


class TestExportEvidence:
    def test_router_tokens_host_paths_and_gpu_uuids_are_redacted(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        env = {
            "ANVIL_ROUTER_ADMIN_TOKEN": "adm-s3cret-1",
            "ANVIL_ROUTER_CLIENT_TOKEN": "cli-s3cret-2",
            "HOME": "/home/operator",
        }
        app = App(settings=fake_host.settings, env=env)
        writer = EvidenceWriter(app.settings.evidence_dir, "tx-export")
        writer.write_json(
            "00-smoke.json",
            {
                "header": "Bearer cli-s3cret-2",
                "admin": "adm-s3cret-1",
                "gpu": GPU_A,
                "paths": [str(writer.tx_dir), "/home/operator/.cache/x"],
                "profile": str(PROFILES_DIR / "real-small.toml"),
            },
        )
        # What the qualify plan records beside the manifest it wrote: export binds to it.
        qualification.record_manifest(app.store, "tx-export", writer.write_manifest().sha256, kind="qualify")
        out = evidence_cmd.export_evidence(app, "tx-exp", tmp_path / "bundle")
        text = (tmp_path / "bundle" / "00-smoke.json").read_text()
        checkout = str(PROFILES_DIR.parent.parent)  # a decision names its profile's file
        for secret in ("cli-s3cret-2", "adm-s3cret-1", GPU_A, "/home/operator", str(writer.tx_dir), checkout):
            assert secret not in text
        assert json.loads(text)["gpu"] == "GPU-REDACTED-1"
        assert out.redactions["secrets"] == 2 and "s3cret" not in json.dumps(asdict(out))
        assert verify_bundle(tmp_path / "bundle").ok
