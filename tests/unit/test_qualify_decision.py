"""The decision: a pure function of gate results, bound to the candidate's identity."""

from __future__ import annotations

import pytest

from anvil_ctl.core.errors import BadInput
from anvil_ctl.qualify.decision import candidate_identity_digest, decide, make_decision
from anvil_ctl.qualify.results import GateKind, GateResult


def gate(name: str, passed: bool, kind: GateKind = "functional") -> GateResult:
    return GateResult(name, passed, kind, "pass" if passed else "x")


class TestDecide:
    @pytest.mark.parametrize(
        ("results", "outcome"),
        [
            ([gate("a", True), gate("r", True, "policy")], "verified"),
            ([gate("a", True)], "verified"),
            ([gate("a", True), gate("r", False, "policy")], "policy-infeasible"),
            ([gate("a", False), gate("r", True, "policy")], "failed"),
            ([gate("a", False), gate("r", False, "policy")], "failed"),
            ([gate("r", False, "policy")], "policy-infeasible"),
            ([], "failed"),
        ],
    )
    def test_outcome(self, results: list[GateResult], outcome: str) -> None:
        assert decide(results) == outcome


class TestMakeDecision:
    def test_the_decision_carries_identity_gates_and_reasons(self) -> None:
        d = make_decision(
            [gate("a", True), gate("r", False, "policy")],
            "digest",
            profile="p",
            artifact_sha256={"a": "h"},
        )
        assert d.outcome == "policy-infeasible"
        assert d.identity_digest == "digest"
        assert d.gates[0]["artifact_sha256"] == "h"
        assert d.reasons == ("policy gate r failed: x",)

    def test_an_unbound_decision_is_refused(self) -> None:
        with pytest.raises(BadInput):
            make_decision([gate("a", True)], "")


class TestCandidateIdentityDigest:
    def test_any_field_changes_the_digest(self) -> None:
        base = {
            "recipe_digest": "r",
            "image_id": "i",
            "model_identity": "m",
            "config_fingerprint": "c",
        }
        digest = candidate_identity_digest(**base)
        for key in base:
            assert candidate_identity_digest(**{**base, key: "other"}) != digest

    def test_an_empty_field_is_refused_by_name(self) -> None:
        with pytest.raises(BadInput) as info:
            candidate_identity_digest(
                recipe_digest="r", image_id="", model_identity="m", config_fingerprint="c"
            )
        assert info.value.data["missing"] == ["image_id"]
