"""Waivers: scope, expiry, revocation, the value in force, and reclassified decisions."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from anvil_ctl.core.digest import canonical_json
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.waiver import VRAM_RESERVE, Waiver
from anvil_ctl.gpu.vram import ReserveResult, VramReserveGate
from anvil_ctl.gpu.waiver_policy import Decision, outcome_of, parse_scope, reclassify, resolve
from tests.unit.fake_gpus import reading

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DIGEST = "ab" * 32
OTHER_DIGEST = "cd" * 32
UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def waiver(**kw: object) -> Waiver:
    base: dict[str, object] = {
        "id": "w-1",
        "policy": "vram-reserve",
        "value": 0,
        "approved_by": "operator",
        "reason": "model-only GPU pair",
        "created_at": T0,
        "roles": frozenset({"compute-a", "compute-b"}),
    }
    base.update(kw)
    return Waiver(**base)  # type: ignore[arg-type]


class TestParseScope:
    def test_roles(self) -> None:
        assert parse_scope("compute-a, compute-b") == (frozenset({"compute-a", "compute-b"}), None)

    def test_a_recipe_digest_with_or_without_prefix(self) -> None:
        assert parse_scope("sha256:" + DIGEST) == (frozenset(), DIGEST)
        assert parse_scope(DIGEST) == (frozenset(), DIGEST)

    def test_garbage_is_bad_input(self) -> None:
        with pytest.raises(BadInput, match="expected a recipe digest"):
            parse_scope("Compute A")


class TestWaiver:
    def test_scope_must_be_roles_or_a_digest_not_both(self) -> None:
        with pytest.raises(BadInput, match="not both"):
            waiver(recipe_digest=DIGEST)
        with pytest.raises(BadInput, match="not both"):
            waiver(roles=frozenset())

    def test_it_must_be_attributed_and_explained(self) -> None:
        with pytest.raises(BadInput, match=r"approved_by.*reason"):
            waiver(approved_by=" ", reason="")

    def test_times_must_be_timezone_aware(self) -> None:
        with pytest.raises(BadInput, match="timezone"):
            waiver(created_at=datetime(2025, 6, 1))

    def test_only_known_policies(self) -> None:
        with pytest.raises(BadInput, match="policy"):
            waiver(policy="context-tokens")


class TestEffectiveReserve:
    def test_no_waiver_keeps_the_default(self) -> None:
        assert effective_reserve(3072, "compute-a", DIGEST, [], T0) == 3072

    def test_a_role_waiver_applies_to_its_roles_only(self) -> None:
        w = waiver(roles=frozenset({"compute-a"}))
        assert effective_reserve(3072, "compute-a", None, [w], T0) == 0
        assert effective_reserve(3072, "compute-b", None, [w], T0) == 3072

    def test_a_digest_waiver_applies_to_that_recipe_on_any_role(self) -> None:
        w = waiver(roles=frozenset(), recipe_digest=DIGEST, value=2048)
        assert effective_reserve(3072, "compute-z", "sha256:" + DIGEST, [w], T0) == 2048
        assert effective_reserve(3072, "compute-z", OTHER_DIGEST, [w], T0) == 3072
        assert effective_reserve(3072, "compute-z", None, [w], T0) == 3072

    def test_a_waiver_does_not_apply_before_it_was_created(self) -> None:
        assert effective_reserve(3072, "compute-a", None, [waiver()], T0 - timedelta(seconds=1)) == 3072

    def test_an_expired_waiver_stops_applying_at_its_expiry(self) -> None:
        w = waiver(expires_at=T0 + timedelta(days=1))
        assert effective_reserve(3072, "compute-a", None, [w], T0 + timedelta(hours=23)) == 0
        assert effective_reserve(3072, "compute-a", None, [w], T0 + timedelta(days=1)) == 3072

    def test_a_revoked_waiver_stops_applying_but_still_answers_for_the_past(self) -> None:
        w = replace(waiver(), revoked_at=T0 + timedelta(hours=1))
        assert effective_reserve(3072, "compute-a", None, [w], T0 + timedelta(hours=2)) == 3072
        assert effective_reserve(3072, "compute-a", None, [w], T0 + timedelta(minutes=30)) == 0

    def test_the_newest_applicable_waiver_wins(self) -> None:
        old = waiver(id="w-old", value=0)
        new = waiver(id="w-new", value=1024, created_at=T0 + timedelta(days=1))
        later = T0 + timedelta(days=2)
        assert effective_reserve(3072, "compute-a", None, [new, old], later) == 1024
        assert effective_reserve(3072, "compute-a", None, [replace(new, revoked_at=later), old], later) == 0


class _Functional:
    def __init__(self, name: str, passed: bool) -> None:
        self.name = name
        self.passed = passed


def seed_393k() -> tuple[Decision, list[object], str]:
    """The seeds' 393,216-token profile: every functional gate passed, 2,101 MiB free per card."""
    gate = VramReserveGate({"compute-a": 3072, "compute-b": 3072}, {"compute-a": UA, "compute-b": UB})
    reserve = gate([reading(UA, 97_887, 97_887 - 2101), reading(UB, 97_887, 97_887 - 2101, index=1)])
    results: list[object] = [
        _Functional("tool-calls", True),
        _Functional("endurance", True),
        reserve,
    ]
    outcome, reasons = outcome_of(results)  # type: ignore[arg-type]
    decision = Decision(
        id="dec-original",
        outcome=outcome,
        identity_digest="id" * 32,
        evidence_id="ev-393k",
        recipe_digest=DIGEST,
        reasons=reasons,
    )
    return decision, results, canonical_json(reserve.evidence())


class TestReclassify:
    def test_the_original_is_policy_infeasible(self) -> None:
        decision, _, _ = seed_393k()
        assert decision.outcome == "policy-infeasible"
        assert decision.reasons == ("vram-reserve failed",)

    def test_a_pair_waiver_reclassifies_into_a_new_verified_decision(self) -> None:
        decision, results, _ = seed_393k()
        new = reclassify(decision, results, [waiver()], T0 + timedelta(hours=1))  # type: ignore[arg-type]
        assert new.outcome == "verified"
        assert new.id != decision.id
        assert new.reclassifies == "dec-original"
        assert new.evidence_id == "ev-393k"
        assert new.identity_digest == decision.identity_digest
        assert new.waiver_ids == ("w-1",)

    def test_the_original_decision_and_evidence_are_left_byte_identical(self) -> None:
        decision, results, evidence_before = seed_393k()
        decision_before = copy.deepcopy(decision.as_dict())
        reclassify(decision, results, [waiver()], T0 + timedelta(hours=1))  # type: ignore[arg-type]
        reserve = results[-1]
        assert isinstance(reserve, ReserveResult)
        assert canonical_json(reserve.evidence()) == evidence_before
        assert decision.as_dict() == decision_before
        assert decision.outcome == "policy-infeasible"

    def test_a_waiver_for_one_card_of_the_pair_is_not_enough(self) -> None:
        decision, results, _ = seed_393k()
        w = waiver(roles=frozenset({"compute-a"}))
        new = reclassify(decision, results, [w], T0 + timedelta(hours=1))  # type: ignore[arg-type]
        assert new.outcome == "policy-infeasible"
        assert new.waiver_ids == ("w-1",)

    def test_an_expired_or_revoked_waiver_reclassifies_nothing(self) -> None:
        decision, results, _ = seed_393k()
        later = T0 + timedelta(days=3)
        for w in (
            waiver(expires_at=T0 + timedelta(days=1)),
            replace(waiver(), revoked_at=T0 + timedelta(days=1)),
        ):
            new = reclassify(decision, results, [w], later)  # type: ignore[arg-type]
            assert new.outcome == "policy-infeasible"
            assert new.waiver_ids == ()

    def test_a_waiver_never_rescues_a_functional_failure(self) -> None:
        decision, results, _ = seed_393k()
        results[0] = _Functional("tool-calls", False)
        new = reclassify(decision, results, [waiver()], T0 + timedelta(hours=1))  # type: ignore[arg-type]
        assert new.outcome == "failed"
        assert new.reasons == ("tool-calls failed",)

    def test_reclassifying_twice_under_the_same_waivers_gives_one_id(self) -> None:
        decision, results, _ = seed_393k()
        a = reclassify(decision, results, [waiver()], T0 + timedelta(hours=1))  # type: ignore[arg-type]
        b = reclassify(decision, results, [waiver()], T0 + timedelta(hours=5))  # type: ignore[arg-type]
        assert a.id == b.id


def effective_reserve(
    default: int, role: str, digest: str | None, waivers: list[Waiver], now: datetime
) -> int:
    """The VRAM reserve in force (`resolve` of the reserve policy)."""
    return resolve(
        VRAM_RESERVE, policy_default=default, role=role, recipe_digest=digest, waivers=waivers, now=now
    ).value
