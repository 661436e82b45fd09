"""The transition table, as a specification: every (from, to) pair is either allowed or banned."""

from __future__ import annotations

import itertools

import pytest

from anvil_ctl.core.states import ALLOWED_TRANSITIONS, IllegalTransition, TxState, check_transition

S = TxState
ALLOWED = sorted(ALLOWED_TRANSITIONS)
BANNED = sorted(set(itertools.product(TxState, TxState)) - ALLOWED_TRANSITIONS)


class TestTransitionTable:
    def test_the_table_is_the_documented_one(self) -> None:
        assert {
            (S.PLANNED, S.RUNNING),
            (S.PLANNED, S.REFUSED),
            (S.RUNNING, S.COMMITTED),
            (S.RUNNING, S.COMPENSATING),
            (S.RUNNING, S.INTERRUPTED),
            (S.RUNNING, S.NEEDS_OPERATOR),
            (S.COMPENSATING, S.COMPENSATED),
            (S.COMPENSATING, S.COMPENSATION_FAILED),
            (S.COMPENSATING, S.INTERRUPTED),
            (S.COMPENSATING, S.NEEDS_OPERATOR),
            (S.INTERRUPTED, S.COMPENSATING),
            (S.INTERRUPTED, S.RUNNING),
            (S.COMPENSATION_FAILED, S.COMPENSATED),
            (S.NEEDS_OPERATOR, S.COMPENSATED),
            (S.RUNNING, S.WATCHING),
            (S.WATCHING, S.COMMITTED),
            (S.WATCHING, S.ROLLED_BACK),
            (S.WATCHING, S.INTERRUPTED),
            (S.WATCHING, S.NEEDS_OPERATOR),
        } == ALLOWED_TRANSITIONS

    def test_allowed_and_banned_cover_the_full_product(self) -> None:
        assert len(ALLOWED) + len(BANNED) == len(TxState) ** 2

    @pytest.mark.parametrize(("source", "target"), ALLOWED)
    def test_allowed_transition_passes(self, source: TxState, target: TxState) -> None:
        check_transition(source, target)

    @pytest.mark.parametrize(("source", "target"), BANNED)
    def test_banned_transition_raises_and_names_both_states(self, source: TxState, target: TxState) -> None:
        with pytest.raises(IllegalTransition) as info:
            check_transition(source, target)
        assert (info.value.source, info.value.target) == (source.value, target.value)

    @pytest.mark.parametrize("terminal", [S.COMMITTED, S.COMPENSATED, S.REFUSED, S.ROLLED_BACK])
    def test_terminal_states_have_no_way_out(self, terminal: TxState) -> None:
        assert not [t for (f, t) in ALLOWED_TRANSITIONS if f == terminal]
